#!/bin/bash
# A real EIO under the trace and graph readers (issue 23, item 10): a trace, and a co-activation graph, on a squashfs
# image whose compressed blocks are damaged, so that the kernel fails the read with EIO (no injection, no preload).
# Whether libhdf5 meets the error opening the file (its superblock) or reading a dataset, the CLIs must report an I/O
# error (exit 4), not bad input.
# Needs root (loop mount), mksquashfs and squashfs in the kernel; otherwise exits 77 (skipped) saying which.
#   check_eio.sh SOURCE_DIR BINARY_DIR
set -u
src=$1 bin=$2
P="$bin/cli/nl-profile" L="$bin/cli/nl-layout"
skip() { echo "SKIP eio: $1"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to loop-mount a squashfs image"
command -v mksquashfs >/dev/null || skip "mksquashfs not installed (scripts/bootstrap.sh: squashfs-tools)"
grep -qw squashfs /proc/filesystems || skip "the kernel has no squashfs"
work=$(mktemp -d "${TMPDIR:-/tmp}/nl-eio.XXXXXX")
mnt=$work/mnt
cleanup() { mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"; }
trap cleanup EXIT
cd "$work" || exit 1
mkdir -p tree mnt
# An uncompressed trace (h5py, no HDF5 filter) so that squashfs compresses every 4 KiB block: a damaged byte in a
# compressed block fails its decompression, which the kernel returns as EIO.
/usr/bin/python3 - tree/t.h5 <<'PY' || { echo "cannot write the trace"; exit 1; }
import sys, h5py, numpy as np
rng = np.random.default_rng(1)
n, tokens = 512, 4096
with h5py.File(sys.argv[1], 'w') as f:
    f.attrs['format'] = 'neuralink-trace'; f.attrs['version'] = np.int64(1)
    f.attrs['model'] = 'eio'; f.attrs['activation'] = 'relu'
    f.attrs['n_layers'] = np.int64(2); f.attrs['n_tokens'] = np.int64(tokens)
    for l in range(2):
        g = f.create_group('layers/%d' % l); g.attrs['n_neurons'] = np.int64(n)
        bits = (rng.random((n, tokens)) < 0.05)
        g.create_dataset('mask', data=np.packbits(bits, axis=1, bitorder='little').view('<u8'))
    f.create_dataset('sequences', data=np.arange(0, tokens, 256, dtype='<i8'))
PY
"$P" inspect tree/t.h5 >/dev/null 2>err || { echo "the undamaged trace does not read:"; cat err; exit 1; }
mkdir -p gtree
# The graph of that trace (top-k lists over several blocks), read by graph-merge and solve --graph.
"$L" graph --trace tree/t.h5 --out gtree/g.h5 -q >/dev/null 2>err || { echo "cannot write the graph:"; cat err; exit 1; }
fails=0 passes=0
# damage IMAGE FILE OFFSET NAME: flip bytes at OFFSET of a copy of IMAGE, mount it, read FILE with its commands.
damage() {
  local img=$1 file=$2 off=$3 name=$4
  cp "$img" d.sqsh
  printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of=d.sqsh bs=1 seek="$off" conv=notrunc status=none
  mount -t squashfs -o loop,ro d.sqsh "$mnt" 2>/dev/null || skip "cannot loop-mount a squashfs image here"
  if cat "$mnt/$file" >/dev/null 2>&1; then
    echo "FAIL $name: the damaged image reads without error (offset $off); the test cannot work"
    fails=$((fails + 1))
  else
    local cmds=(inspect solve)
    [ "$file" = g.h5 ] && cmds=(graph-merge solve-graph)
    for cmd in "${cmds[@]}"; do
      case $cmd in
        inspect) timeout 60 "$P" inspect "$mnt/t.h5" >out 2>err ;;
        solve) timeout 60 "$L" solve --trace "$mnt/t.h5" --method frequency --out lay.json -q >out 2>err ;;
        graph-merge) timeout 60 "$L" graph-merge "$mnt/g.h5" --out m.h5 -q >out 2>err ;;
        solve-graph) timeout 60 "$L" solve --graph "$mnt/g.h5" --method greedy --out lay.json -q >out 2>err ;;
      esac
      rc=$?
      if [ "$rc" = 4 ] && [ "$(wc -l <err)" = 1 ] && grep -q 'Input/output error' err; then
        echo "PASS $name: $cmd exit 4: $(cat err)"; passes=$((passes + 1))
      else
        echo "FAIL $name: $cmd exit $rc, expected 4 with one 'Input/output error' line"; sed 's/^/     /' err | head -3
        fails=$((fails + 1))
      fi
    done
  fi
  umount "$mnt"
}
# The file's data blocks lie between the 96-byte superblock and the inode table (superblock offset 64, le64).
for kind in trace graph; do
  if [ $kind = trace ]; then dir=tree file=t.h5; else dir=gtree file=g.h5; fi
  mksquashfs $dir $kind.sqsh -b 4096 -comp gzip -no-fragments -noappend -quiet >/dev/null || exit 1
  data_end=$(od -An -t u8 -j 64 -N 8 $kind.sqsh | tr -d ' ')
  damage $kind.sqsh $file 100 "$kind: first block (HDF5 superblock)"
  damage $kind.sqsh $file $(( (96 + data_end) / 2 )) "$kind: middle block (dataset data)"
  damage $kind.sqsh $file $(( data_end - 40 )) "$kind: last block"
done
echo "eio: $passes passed, $fails failed"
[ "$fails" = 0 ]
