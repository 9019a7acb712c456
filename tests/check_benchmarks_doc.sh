#!/bin/bash
# docs/benchmarks.md stays a report and its commands stay runnable (issue 57):
# - the file is at most 60 KiB (61,440 bytes); earlier runs belong in docs/history/;
# - every command quoted in its ``` blocks still parses: for each nl-profile / nl-layout / nl-run command (after `$ `,
#   env assignments, nice, /usr/bin/time; `\` continuations joined; `;`, `&&`, `|`, `&` split), every `--option` on
#   the line must be listed by `<binary> --help` (before the subcommand) or `<binary> <subcommand> --help` (after it;
#   CLI11 takes the global options there too). CLI11's --help exits before it validates anything else, so the options
#   are compared by name rather than by running the command. The same for `python3 bench/*.py` / `scripts/*.py`
#   (their --help; the script's own source where its imports are missing), `./run.sh bench` / `scripts/bench.sh`
#   (options passed through to the suite's script), `bench/*.sh` (the file exists) and `build/bench/*` (the option
#   in bench/<name>.cpp).
# Fails (exit 1) on an oversized file or any unknown option; exits 77 (skipped, the reason printed and written to
# BINARY_DIR/tests/skipped/benchmarks_doc.txt) only when a binary the doc quotes is not built.
#   check_benchmarks_doc.sh SOURCE_DIR BINARY_DIR [DOC]      (or: check_benchmarks_doc.sh BINARY_DIR)
set -u
if [ $# -ge 2 ]; then
  src=$1 bin=$2 doc=${3:-$1/docs/benchmarks.md}
elif [ $# -eq 1 ]; then
  src=$(cd "$(dirname "$0")/.." && pwd) bin=$1 doc=$src/docs/benchmarks.md
else
  echo "usage: check_benchmarks_doc.sh SOURCE_DIR BINARY_DIR [DOC]  (or: check_benchmarks_doc.sh BINARY_DIR)" >&2
  exit 2
fi
py=/usr/bin/python3
[ -x "$py" ] || py=python3
exec "$py" - "$src" "$bin" "$doc" <<'PY'
import os, re, shlex, subprocess, sys

src, build, doc = sys.argv[1:4]
LIMIT = 61440
CLIS = ('nl-profile', 'nl-layout', 'nl-run')
failures, skips, checked = [], [], []
rel = os.path.relpath(doc, src) if doc.startswith(src) else doc

def fail(line, msg):
    failures.append('%s:%d: %s' % (rel, line, msg))

size = os.path.getsize(doc)
if size > LIMIT:
    failures.append('%s is %d bytes, over the %d-byte limit: move earlier runs to docs/history/' % (rel, size, LIMIT))

def run_help(argv, cwd=None):
    try:
        p = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return p.returncode, p.stdout.decode('utf-8', 'replace')

cli_help = {}
def cli_options(name, sub):
    """Options and subcommands listed by `name [sub] --help` (CLI11): the long names at the start of option lines."""
    key = (name, sub)
    if key not in cli_help:
        argv = [os.path.join(build, 'cli', name)] + ([sub] if sub else []) + ['--help']
        rc, out = run_help(argv)
        if rc != 0:
            cli_help[key] = None
            return None
        opts, subs, in_subs = set(), set(), False
        for l in out.splitlines():
            if re.match(r'^\S.*:\s*$', l):
                in_subs = l.strip().lower().startswith('subcommands')
                continue
            m = re.match(r'^\s+(-\S+)', l)
            if m:
                opts.update(re.findall(r'--[A-Za-z0-9][\w-]*', m.group(1)))
            elif in_subs:
                m = re.match(r'^\s{1,4}([a-z][\w+-]*)\s', l + ' ')
                if m:
                    subs.add(m.group(1))
        cli_help[key] = (opts, subs)
    return cli_help[key]

def long_options(args):
    out = []
    for a in args:
        a = a.strip('[]')
        if re.match(r'^--[A-Za-z0-9]', a):
            out.append(a.split('=', 1)[0])
    return out

def check_cli(line, name, args):
    path = os.path.join(build, 'cli', name)
    if not os.access(path, os.X_OK):
        skips.append('%s:%d: %s not built (%s)' % (rel, line, name, path))
        return
    top = cli_options(name, None)
    if top is None:
        fail(line, '`%s --help` failed' % name)
        return
    top_opts, subs = top
    sub_i = next((i for i, a in enumerate(args) if a in subs), None)
    before = args if sub_i is None else args[:sub_i]
    for o in long_options(before):
        if o not in top_opts:
            fail(line, '%s: option %s is not listed by `%s --help`' % (name, o, name))
    if sub_i is None:
        if not any(a in ('--help', '--version') for a in args):
            fail(line, '%s: no subcommand of `%s --help` (%s) on the line' % (name, name, ', '.join(sorted(subs))))
        checked.append(name)
        return
    sub = args[sub_i]
    sh = cli_options(name, sub)
    if sh is None:
        fail(line, '`%s %s --help` failed' % (name, sub))
        return
    for o in long_options(args[sub_i + 1:]):
        if o not in sh[0] and o not in top_opts:
            fail(line, '%s %s: option %s is not listed by `%s %s --help`' % (name, sub, o, name, sub))
    checked.append('%s %s' % (name, sub))

py_help = {}
def check_script(line, script, args):
    path = os.path.join(src, script)
    if not os.path.isfile(path):
        fail(line, '%s does not exist' % script)
        return
    opts = long_options(args)
    if script.endswith('.py'):
        if script not in py_help:
            rc, out = run_help([sys.executable, path, '--help'], cwd=src)
            if rc == 0:
                py_help[script] = ('help', set(re.findall(r'--[A-Za-z0-9][\w-]*', out)))
            else:   # e.g. numpy missing: the option strings in the source
                text = open(path, encoding='utf-8', errors='replace').read()
                py_help[script] = ('source', set(re.findall(r'''['"](--[A-Za-z0-9][\w-]*)['"]''', text)) | {'--help'})
        how, known = py_help[script]
        for o in opts:
            if o not in known:
                fail(line, '%s: option %s is not in its %s' % (script, o, '--help' if how == 'help' else 'source'))
    else:
        text = open(path, encoding='utf-8', errors='replace').read()
        for o in opts:
            if o not in text:
                fail(line, '%s: option %s does not appear in it' % (script, o))
    checked.append(script)

def check_bench_driver(line, args):
    """./run.sh bench / scripts/bench.sh [BUILD] [--suite S] [options of the suite's script]"""
    if args and not args[0].startswith('-'):
        args = args[1:]
    suite, rest, i = 'all', [], 0
    while i < len(args):
        a = args[i].strip('[]')
        if a == '--suite' and i + 1 < len(args):
            suite = args[i + 1]; i += 2; continue
        if a.startswith('--suite='):
            suite = a.split('=', 1)[1]; i += 1; continue
        rest.append(args[i]); i += 1
    if suite not in ('all', 'micro', 'layouts', 'e2e'):
        fail(line, 'bench suite %r is not one of all, micro, layouts, e2e' % suite)
        return
    if suite == 'micro':
        checked.append('bench --suite micro')
        return
    check_script(line, 'bench/e2e/run.py' if suite == 'e2e' else 'bench/layouts_bench.py', rest)

def check_built_bench(line, name, args):
    path = os.path.join(src, 'bench', name + '.cpp')
    if not os.path.isfile(path):
        fail(line, 'build/bench/%s: bench/%s.cpp does not exist' % (name, name))
        return
    text = open(path, encoding='utf-8', errors='replace').read()
    for o in long_options(args):
        if '"%s"' % o not in text:
            fail(line, 'build/bench/%s: option %s is not in bench/%s.cpp' % (name, o, name))
    checked.append('build/bench/' + name)

WRAPPERS = {'nice': {'-n'}, '/usr/bin/time': {'-f', '-o'}, 'time': set(), 'timeout': set(), 'exec': set(),
            'env': set()}
def check_segment(line, toks):
    while toks:
        t = toks[0]
        if t in ('$', 'do', 'then', 'else', '!') or re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', t):
            toks = toks[1:]
        elif t in WRAPPERS:
            takes_value, i = WRAPPERS[t], 1
            while i < len(toks) and toks[i].startswith('-'):
                i += 2 if toks[i] in takes_value else 1
            if t == 'timeout' and i < len(toks):
                i += 1          # the duration
            toks = toks[i:]
        else:
            break
    if not toks or toks[0] in ('for', 'while', 'if', 'done', 'fi', 'wait', 'cd', 'export', 'echo'):
        return
    cmd, args = toks[0], toks[1:]
    base = os.path.basename(cmd)
    if base in CLIS:
        check_cli(line, base, args)
    elif base in ('python3', 'python') and args:
        script = args[0]
        if re.match(r'^(\./)?(bench|scripts)/\S+\.py$', script):
            check_script(line, script[2:] if script.startswith('./') else script, args[1:])
    elif re.match(r'^(\./)?(bench|scripts)/\S+\.(py|sh)$', cmd):
        script = cmd[2:] if cmd.startswith('./') else cmd
        if script == 'scripts/bench.sh':
            check_bench_driver(line, args)
        else:
            check_script(line, script, args)
    elif cmd in ('./run.sh', 'run.sh') and args and args[0] == 'bench':
        check_bench_driver(line, args[1:])
    elif re.match(r'^(\./)?build/bench/\w+$', cmd):
        check_built_bench(line, os.path.basename(cmd), args)

def split_segments(text):
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=';&|()')
        lex.whitespace_split = True
        lex.commenters = '#'
        toks = list(lex)
    except ValueError:
        toks = text.split()
    seg = []
    for t in toks:
        if t and set(t) <= set(';&|()'):
            if seg:
                yield seg
            seg = []
        else:
            seg.append(t)
    if seg:
        yield seg

lines = open(doc, encoding='utf-8').read().split('\n')
fence, pending, start = False, '', 0
for no, l in enumerate(lines, 1):
    if l.lstrip().startswith('```'):
        fence, pending = not fence, ''
        continue
    if not fence:
        continue
    if not pending:
        start = no
    if l.rstrip().endswith('\\'):
        pending += l.rstrip()[:-1] + ' '
        continue
    logical, pending = pending + l, ''
    if logical.lstrip().startswith('#'):
        continue
    for seg in split_segments(logical):
        check_segment(start, seg)

n_cli = sum(1 for c in checked if c.split()[0] in CLIS)
print('%s: %d bytes (limit %d); %d quoted commands checked (%d of nl-profile / nl-layout / nl-run)'
      % (rel, size, LIMIT, len(checked), n_cli))
if n_cli == 0 and not skips:
    failures.append('%s: no nl-profile / nl-layout / nl-run command found in its ``` blocks' % rel)
for f in failures:
    print('FAIL ' + f)
if failures:
    sys.exit(1)
if skips:
    d = os.path.join(build, 'tests', 'skipped')
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'benchmarks_doc.txt'), 'w') as f:
        f.write('%d quoted command(s) not checked: %s\n' % (len(skips), skips[0]))
    for s in skips:
        print('SKIP ' + s)
    sys.exit(77)
try:
    os.remove(os.path.join(build, 'tests', 'skipped', 'benchmarks_doc.txt'))
except OSError:
    pass
print('OK')
PY
