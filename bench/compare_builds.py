#!/usr/bin/python3
"""Summary of bench/compare-builds.sh: per metric, the new build's speed
divided by the old build's, round by round, and the verdict.

The raw outputs lie in one folder, one file per (round, part, build):
r<round>-<part>-<old|new>.out, as `tensorpar bench <part> ...` printed
them (JSON for all/forward/decode/comm, text tables for kernels), and
r<round>-<part>-<old|new>.load with /proc/loadavg before the run.

Every ratio is a *speed* ratio, new ÷ old: a rate (tokens/s, GFLOP/s,
GB/s) divided as is, a time (seconds, µs) inverted, so > 1 always means
the new build is faster.  A ratio is taken within a round only (the two
builds ran back to back there), because the shared machine drifts between
rounds.  A metric counts as a slowdown when its whole range over the
rounds lies below 1 - tolerance: the new build was slower in every round
by more than the tolerance.  A median below 1 - tolerance whose range
still reaches it is reported as "suspect" (rerun with more rounds).

The machine's own figures that `bench all` measures in each launch (FMA
peak, read bandwidth) are controls: printed, with their ratios, as the
noise of the moment, but left out of the verdict, since they time the
host rather than the code under comparison."""

import json
import os
import re
import statistics
import sys

OUT_RE = re.compile(r"^r(\d+)-([a-z]+)-(old|new)\.out$")


def _add(m, name, value, kind):
    """kind is 'rate' (higher is faster) or 'time' (lower is faster)."""
    if value is not None and value > 0:
        m[name] = (float(value), kind)


def parse_all(text):
    j = json.loads(text)
    m = {}
    for cfg, s in j.get("prefill_seconds", {}).items():
        _add(m, f"prefill {cfg} (s)", s, "time")
    for cfg, r in j.get("decode_tokens_per_s", {}).items():
        _add(m, f"decode {cfg} (tokens/s)", r, "rate")
    for k, label in (("fma_gflops_1", "machine FMA peak 1 thread (GFLOP/s)"),
                     ("fma_gflops_2", "machine FMA peak 2 threads (GFLOP/s)"),
                     ("read_gbs_1", "machine read bandwidth 1 thread (GB/s)"),
                     ("read_gbs_2", "machine read bandwidth 2 threads (GB/s)")):
        _add(m, label, j.get(k), "rate")
    return m


def _tp_name(side):
    return f"TP={side['tp']}x{side['threads']}"


def parse_forward(text):
    j = json.loads(text)
    m = {}
    for side in ("tp1", "tpN"):
        s = j[side]
        _add(m, f"forward {j.get('dtype', '?')} seq {j.get('seq')} {_tp_name(s)} (s)", s["seconds"], "time")
    return m


def parse_decode(text):
    j = json.loads(text)
    m = {}
    for side in ("tp1", "tpN"):
        s = j[side]
        _add(m, f"decode {j.get('dtype', '?')} {_tp_name(s)} (tokens/s)", s["tokens_per_s"], "rate")
    return m


def parse_comm(text):
    m = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j.get("backend") == "none":   # the memcpy reference: not our code
            continue
        _add(m, f"comm {j['op']} {j['backend']} x{j['ranks']} {j['bytes']} B (us)", j["median_us"], "time")
    return m


def parse_kernels(text):
    """The text tables of `bench kernels`: a title line, a header starting
    with 'shape' (columns two or more spaces apart), rows up to a blank
    line.  Shapes may contain a space ("gate/up T=1"), so the values are
    taken from the right.  'share' columns (of the bandwidth) are left out."""
    m = {}
    lines = text.splitlines()
    peak = re.compile(r"^(compute peak|read bandwidth)\b.*?: ([\d.]+) \S+ on 1 thread, ([\d.]+) on 2")
    for ln in lines:
        p = peak.match(ln)
        if p:
            _add(m, f"kernels {p.group(1)} 1 thread", float(p.group(2)), "rate")
            _add(m, f"kernels {p.group(1)} 2 threads", float(p.group(3)), "rate")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("shape") or i == 0:
            i += 1
            continue
        parts = lines[i - 1].split(",")
        title = parts[0].strip() + (" cold" if len(parts) > 1 and "cold" in parts[1] else "")
        cols = re.split(r"\s{2,}", lines[i].strip())[1:]
        seen = {}
        for k, c in enumerate(cols):
            seen[c] = seen.get(c, 0) + 1
            if seen[c] > 1:
                cols[k] = f"{c} #{seen[c]}"
        i += 1
        while i < len(lines) and lines[i].strip():
            tok = lines[i].split()
            vals, shape = tok[-len(cols):], " ".join(tok[:-len(cols)])
            for c, v in zip(cols, vals):
                if c.startswith("share") or v == "-":
                    continue
                try:
                    _add(m, f"kernels {title} {shape} {c}", float(v.rstrip("%")), "rate")
                except ValueError:
                    pass
            i += 1
    return m


PARSERS = {"all": parse_all, "forward": parse_forward, "decode": parse_decode,
           "comm": parse_comm, "kernels": parse_kernels}


def load_rounds(folder):
    """{(round, part, build): {metric: (value, kind)}} and the load averages."""
    runs, loads = {}, []
    for f in sorted(os.listdir(folder)):
        mt = OUT_RE.match(f)
        if not mt:
            continue
        rnd, part, build = int(mt.group(1)), mt.group(2), mt.group(3)
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
            runs[(rnd, part, build)] = PARSERS[part](fh.read())
        lp = os.path.join(folder, f[:-4] + ".load")
        if os.path.exists(lp):
            with open(lp, encoding="utf-8") as fh:
                loads.append(float(fh.read().split()[0]))
    return runs, loads


def speed_ratio(old, new, kind):
    return new / old if kind == "rate" else old / new


def compare(runs):
    """Per metric: the rounds' speed ratios (new ÷ old) and the medians of
    both builds' own figures.  Only rounds where both builds gave the metric
    count."""
    per = {}
    for (rnd, part, build), m in runs.items():
        if build != "old":
            continue
        new = runs.get((rnd, part, "new"))
        if new is None:
            continue
        for name, (ov, kind) in m.items():
            if name not in new:
                continue
            nv = new[name][0]
            e = per.setdefault(name, {"kind": kind, "ratios": [], "old": [], "new": []})
            e["ratios"].append(speed_ratio(ov, nv, kind))
            e["old"].append(ov)
            e["new"].append(nv)
    return per


def is_control(name):
    return name.startswith("machine ")


def verdict(per, tol):
    """(slow, suspect): metrics whose whole range is below 1 - tol, and
    those whose median only is; controls left out."""
    slow, suspect = [], []
    for name, e in per.items():
        if is_control(name):
            continue
        if max(e["ratios"]) < 1.0 - tol:
            slow.append(name)
        elif statistics.median(e["ratios"]) < 1.0 - tol:
            suspect.append(name)
    return slow, suspect


def _fmt(v):
    return f"{v:.4g}"


def report(per, loads, tol, out=None):
    out = out or sys.stdout
    w = max([len(n) for n in per] + [6])
    print(f"{'metric':<{w}}  {'old':>9} {'new':>9}  speed new/old  min..max   rounds", file=out)
    for name in sorted(per):
        e = per[name]
        r = e["ratios"]
        flag = ""
        if is_control(name):
            flag = "  (control)"
        elif max(r) < 1.0 - tol:
            flag = "  SLOWER"
        elif statistics.median(r) < 1.0 - tol:
            flag = "  suspect"
        print(f"{name:<{w}}  {_fmt(statistics.median(e['old'])):>9} {_fmt(statistics.median(e['new'])):>9}"
              f"  {statistics.median(r):13.3f}  {min(r):.3f}..{max(r):.3f}  {len(r)}{flag}", file=out)
    allr = [x for e in per.values() for x in e["ratios"]]
    if allr:
        spreads = [max(e["ratios"]) - min(e["ratios"]) for e in per.values()]
        print(f"\nnoise: all {len(allr)} ratios {min(allr):.3f}..{max(allr):.3f}; "
              f"median spread (max - min) per metric {statistics.median(spreads):.3f}", file=out)
    if loads:
        print(f"load average before the runs: {min(loads):.2f}..{max(loads):.2f}", file=out)
        cores = os.cpu_count() or 1
        if max(loads) > cores:
            print(f"warning: the machine was busy (load average up to {max(loads):.1f} on {cores} cores):"
                  " the ratios carry other jobs' noise; rerun idle, or with more rounds,"
                  " before trusting a SLOWDOWN", file=out)
    moved = [n for n, e in per.items()
             if is_control(n) and not 1.0 - tol <= statistics.median(e["ratios"]) <= 1.0 / (1.0 - tol)]
    if moved:
        print(f"warning: {len(moved)} control(s) moved beyond the tolerance ({'; '.join(sorted(moved))}):"
              " the host ran the two builds' launches at different speeds; a SLOWDOWN the controls"
              " share is the host's, rerun", file=out)
    slow, suspect = verdict(per, tol)
    if not [n for n in per if not is_control(n)]:
        print("verdict: nothing to compare (no metric measured by both builds)", file=out)
        return 1
    if slow:
        print(f"verdict: SLOWDOWN (tolerance {tol:.0%}): {len(slow)} metric(s) slower in every round: "
              + "; ".join(slow), file=out)
        return 3
    note = ""
    if suspect:
        note = (f" ({len(suspect)} metric(s) with a median below {1 - tol:.2f} but a range reaching it:"
                f" rerun with more --rounds to settle: " + "; ".join(suspect) + ")")
    print(f"verdict: no slowdown (tolerance {tol:.0%}: every metric's range of new/old reaches"
          f" {1 - tol:.2f} or above){note}", file=out)
    return 0


def main(argv):
    if len(argv) < 2:
        print("usage: compare_builds.py RAW_DIR [TOLERANCE] [SUMMARY_JSON]", file=sys.stderr)
        return 2
    folder = argv[1]
    tol = float(argv[2]) if len(argv) > 2 else 0.05
    runs, loads = load_rounds(folder)
    per = compare(runs)
    rc = report(per, loads, tol)
    if len(argv) > 3:
        slow, suspect = verdict(per, tol)
        summary = {"tolerance": tol, "slower": slow, "suspect": suspect,
                   "loadavg": [min(loads), max(loads)] if loads else None,
                   "metrics": {n: {"kind": e["kind"], "ratios": e["ratios"],
                                   "median": statistics.median(e["ratios"]),
                                   "old_median": statistics.median(e["old"]),
                                   "new_median": statistics.median(e["new"])}
                               for n, e in per.items()}}
        with open(argv[3], "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
