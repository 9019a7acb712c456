"""Hand-written SVG figures for the bench scripts (stdlib only, no plotting library on the phone-side machines).

The frame every figure shares (svg_open), the atomic write (svg_write), panels of horizontal bars with min-max
whiskers (bar_panels) and the CSV written beside each figure (write_csv): a figure shows only what its script
measured, and the CSV holds the same numbers.
"""
import csv
import math
import os


def svg_open(width, height, title, title_x):
    """The opening elements: the root, a white background and the title (14 px, at title_x, y = 22)."""
    return ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
            % (width, height), '<rect width="100%" height="100%" fill="white"/>',
            '<text x="%d" y="22" font-size="14">%s</text>' % (title_x, esc(title))]


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_write(path, parts):
    """Closes the root when needed and writes atomically (a reader never sees half a figure)."""
    if not parts[-1].startswith("</svg"):
        parts = parts + ["</svg>"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(parts) + "\n")
    os.replace(tmp, path)


def write_csv(path, header, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    os.replace(tmp, path)


COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"]


def cut3(v):
    """v cut (never rounded up) to 3 significant digits, as the project prints figures: 2.497 -> 2.49."""
    if v <= 0:
        return "%g" % v
    step = 10 ** (math.floor(math.log10(v)) - 2)
    return "%g" % float("%.12g" % (math.floor(v / step + 1e-9) * step))


def nice_max(v):
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above v (the axis end)."""
    if v <= 0:
        return 1.0
    k = 10 ** int(f"{v:e}".split("e")[1])
    for m in (1, 2, 2.5, 5, 10):
        if m * k >= v:
            return m * k
    return 10 * k


def bar_panels(path, title, panels, series, unit, notes=()):
    """One panel per workload, each on its own linear scale from 0: a row per group (e.g. a layout) with one bar per
    series (e.g. a gap policy) at the median and a whisker from min to max (none when they are equal).
      panels: [(panel title, [(group label, {series: (median, lo, hi)}), ...]), ...]
      series: the series names in drawing order (a group may lack some)."""
    bar_h, gap_h, L, R, W = 12, 8, 150, 30, 760
    panel_hs = [30 + len(groups) * (len(series) * bar_h + gap_h) + 28 for _, groups in panels]
    top = 60
    H = top + sum(panel_hs) + 16 * len(notes) + 10
    o = svg_open(W, H, title, 20)
    x = 20
    for i, s in enumerate(series):  # legend
        o.append('<rect x="%d" y="34" width="12" height="12" fill="%s"/><text x="%d" y="44">%s</text>'
                 % (x, COLOURS[i % len(COLOURS)], x + 16, esc(s)))
        x += 30 + 7 * len(s)
    y = top
    for (ptitle, groups), ph in zip(panels, panel_hs):
        vmax = nice_max(max([v[2] for _, d in groups for v in d.values()] + [0]))
        px = lambda v: L + (W - L - R) * v / vmax
        o.append('<text x="20" y="%d" font-weight="bold">%s</text>' % (y + 16, esc(ptitle)))
        y0 = y + 26
        y1 = y0 + len(groups) * (len(series) * bar_h + gap_h)
        for t in range(5):
            v = vmax * t / 4
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" '
                     'text-anchor="middle" font-size="10">%g</text>' % (px(v), y0, px(v), y1, px(v), y1 + 12, v))
        o.append('<text x="%d" y="%d" text-anchor="end" font-size="10">%s</text>' % (W - R, y1 + 24, esc(unit)))
        gy = y0
        for label, d in groups:
            o.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                     % (L - 6, gy + len(series) * bar_h / 2 + 4, esc(label)))
            for i, s in enumerate(series):
                if s in d:
                    med, lo, hi = d[s]
                    by = gy + i * bar_h
                    # the tooltip has the numbers at the CSV's precision (6 digits), so the two can be compared
                    o.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s, %s: %.6g %s '
                             '[%.6g-%.6g]</title></rect>' % (L, by + 1, px(med) - L, bar_h - 2,
                                                             COLOURS[i % len(COLOURS)], esc(label), esc(s), med,
                                                             esc(unit), lo, hi))
                    if hi > lo:  # a spread was measured
                        o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>'
                                 % (px(lo), by + bar_h / 2, px(hi), by + bar_h / 2))
                    o.append('<text x="%.1f" y="%d" font-size="10">%s</text>' % (px(hi) + 4, by + bar_h - 2, cut3(med)))
            gy += len(series) * bar_h + gap_h
        y += ph
    for n in notes:
        o.append('<text x="20" y="%d" font-size="11">%s</text>' % (y + 4, esc(n)))
        y += 16
    svg_write(path, o)
