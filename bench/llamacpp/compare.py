"""The side-by-side rounds of bench/llamacpp/run.sh: llama.cpp's llama-bench
(pp N, tg N) and `tensorpar bench model` (prefill N, decode N) on the same
weights, the same threads, one machine, one run.

Each round measures, for every dtype, test and thread count, llama.cpp once
and each tensorpar configuration of that thread count once (1 thread: TP=1x1;
T threads: TP=1xT and TP=Tx1), ordered so that each ratio's two sides run
back to back — [tensorpar, llama.cpp] or, with two configurations,
[TP=1xT, llama.cpp, TP=Tx1] — and reversed every other round, so that the
host's drift favours neither side.  Each ratio (tensorpar tokens/s over
llama.cpp tokens/s) is taken within a round; the report gives the median
over the rounds and the range.  Every launch loads the model and warms up
untimed; a prefill is the median of --pp-reps passes, a decode one run of
its steps, on both sides."""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# the speed targets against llama.cpp (tensorpar / llama.cpp), by (test, dtype), for
# TP=1xT and TP=Tx1 with T > 1; prefill's depends on the CPU class
TARGET_DECODE = {"bf16": 1.3, "f32": 1.3, "q8_0": 1.1}
TARGET_PREFILL_AVX2, TARGET_PREFILL_AVX512 = 1.5, 1.7


def bench_env():
    """The benchmark's own commands run without OPENBLAS_CORETYPE (the host
    sets it; neither side should inherit a forced OpenBLAS kernel)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    return env


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_summary():
    """The first CPU of /proc/cpuinfo: its name, family and model, and the
    flags that decide the kernel paths."""
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
    flags = set(fields.get("flags", "").split())
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if x in flags]
    name = f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    return {"cpu": name, "cores": os.cpu_count(), "flags": isa}


def llama_system_info(bindir):
    """llama.cpp's own statement of the instructions it was built with
    (llama_print_system_info), through the shared library of the build."""
    for d in (bindir, os.path.join(bindir, "..", "lib"), os.path.join(bindir, "..", "src")):
        p = os.path.join(d, "libllama.so")
        if os.path.exists(p):
            try:
                lib = ctypes.CDLL(p)
                lib.llama_print_system_info.restype = ctypes.c_char_p
                return lib.llama_print_system_info().decode().strip()
            except OSError as e:
                return f"? ({e})"
    return "?"


class Refused(Exception):
    pass


def run_json(cmd, env, what):
    """Runs cmd and returns its JSON; a refusal of the q8_0 or q4_0 dtype
    raises Refused (with the line that says why), any other failure ends the
    run."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        err = (p.stderr or p.stdout).strip()
        why = [ln for ln in err.splitlines() if ("q8_0" in ln or "q4_0" in ln) and "error" in ln]
        if why:
            raise Refused(why[0].split("error: ", 1)[-1])
        sys.exit(f"{what} failed ({p.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return json.loads(p.stdout)


def llama_bench(a, gguf_path, test, threads):
    n = a.pp if test == "pp" else a.tg
    cmd = [os.path.join(a.llama_bin, "llama-bench"), "-m", gguf_path, "-t", str(threads), "-o", "json",
           "-p", str(n if test == "pp" else 0), "-n", str(n if test == "tg" else 0),
           "-r", str(a.pp_reps if test == "pp" else 1)]
    j = run_json(cmd, bench_env(), "llama-bench")[0]
    secs = statistics.median(j["samples_ns"]) / 1e9
    return {"seconds": secs, "tokens_per_s": n / secs, "info": {k: j.get(k) for k in (
        "build_commit", "cpu_info", "backends", "model_type", "n_batch", "n_ubatch", "type_k", "type_v",
        "flash_attn", "use_mmap", "n_threads")}}


def tensorpar_bench(a, dtype, test, tp, threads):
    """dtype bf16-dot: bf16 weights with --matmul bf16, the activations
    rounded to bf16 (vdpbf16ps/AMX) as llama.cpp's bf16 matmuls round them;
    every other dtype --matmul exact, whatever TENSORPAR_BF16_DOT says."""
    mode = ["--mode", "prefill", "--seq", str(a.pp), "--reps", str(a.pp_reps)] if test == "pp" else \
        ["--mode", "decode", "--prompt", "1", "--new-tokens", str(a.tg), "--reps", "1"]
    matmul = "bf16" if dtype == "bf16-dot" else "exact"
    if dtype == "bf16-dot":
        dtype = "bf16"
    cmd = [a.tensorpar, "bench", "model", "--model", a.model, *mode, "--tp", str(tp), "--threads", str(threads),
           "--dtype", dtype, "--matmul", matmul, "--json"]
    j = run_json(cmd, bench_env(), "tensorpar bench model")
    return {"seconds": j["seconds"], "tokens_per_s": j["tokens_per_s"], "info": {"isa": j["isa"]}}


def groups(a):
    """(dtype, test, threads, [tensorpar (tp, threads)]) of one round, in order."""
    out = []
    for dtype in a.dtypes:
        for test in ("pp", "tg"):
            for t in a.threads:
                out.append((dtype, test, t, [(1, 1)] if t == 1 else [(1, t), (t, 1)]))
    return out


def order(configs, rnd):
    """The launches of one group: each tensorpar configuration next to llama.cpp."""
    seq = [("tp", configs[0]), ("llama", None)] + [("tp", c) for c in configs[1:]]
    return seq if rnd % 2 == 0 else seq[::-1]


def measure_rounds(a, log):
    refused = {}
    rows = []
    for rnd in range(a.rounds):
        for dtype, test, t, configs in groups(a):
            got = {}
            for side, c in order(configs, rnd):
                load = loadavg()
                if side == "llama":
                    m = llama_bench(a, a.gguf[dtype], test, t)
                elif dtype in refused or (dtype, c) in refused:
                    continue
                else:
                    try:
                        m = tensorpar_bench(a, dtype, test, *c)
                    except Refused as e:
                        # the dtype as a whole (an option value it does not know)
                        # or this TP size only (shards that are not whole blocks)
                        key = dtype if "expects" in str(e) else (dtype, c)
                        refused[key] = str(e)
                        log(f"tensorpar refuses {dtype} at TP={c[0]}x{c[1]}: {e} (llama.cpp alone there)")
                        continue
                m.update(round=rnd, dtype=dtype, test=test, threads=t, side=side, config=c, load=load,
                         time=time.strftime("%H:%M:%S"))
                got[(side, c)] = m
                rows.append(m)
                who = "llama.cpp" if side == "llama" else f"tensorpar TP={c[0]}x{c[1]}"
                log(f"round {rnd + 1}/{a.rounds} {dtype} {test}{a.pp if test == 'pp' else a.tg} "
                    f"{t} thr: {who} {m['tokens_per_s']:.2f} tok/s (load {load:.2f})")
    return rows, refused


def summarise(a, rows, refused):
    out = []
    for dtype, test, t, configs in groups(a):
        ll = {r["round"]: r for r in rows if (r["dtype"], r["test"], r["threads"], r["side"]) == (dtype, test, t, "llama")}
        for c in configs:
            tp = {r["round"]: r for r in rows if (r["dtype"], r["test"], r["threads"], r["side"], r["config"]) ==
                  (dtype, test, t, "tp", c)}
            ratios = [tp[k]["tokens_per_s"] / ll[k]["tokens_per_s"] for k in sorted(tp) if k in ll]
            out.append({"dtype": dtype, "test": test, "threads": t, "tp": c[0], "tp_threads": c[1],
                        "llama_tokens_per_s": statistics.median(r["tokens_per_s"] for r in ll.values()),
                        "tensorpar_tokens_per_s": statistics.median(r["tokens_per_s"] for r in tp.values()) if tp else None,
                        "ratio": statistics.median(ratios) if ratios else None,
                        "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                        "rounds": len(ratios), "refused": refused.get(dtype) or refused.get((dtype, c))})
    return out


def target(s, info):
    if s["tp_threads"] * s["tp"] < 2:
        return None
    if s["test"] == "tg":
        return TARGET_DECODE.get(s["dtype"])
    if s["dtype"] in ("q8_0", "q4_0"):
        return None
    big = "avx512_bf16" in info["machine"]["flags"] or "amx_bf16" in info["machine"]["flags"]
    return TARGET_PREFILL_AVX512 if big else TARGET_PREFILL_AVX2


def table(summary, info, a):
    lines = ["| dtype | test | threads | tensorpar | llama.cpp tok/s | tensorpar tok/s | ratio (median) | range | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        name = f"{'pp' if s['test'] == 'pp' else 'tg'}{a.pp if s['test'] == 'pp' else a.tg}"
        tgt = target(s, info)
        if s["ratio"] is None:
            verdict = "tensorpar refuses it (below)" if s["refused"] else "no figure"
            lines.append(f"| {s['dtype']} | {name} | {s['threads']} | TP={s['tp']}x{s['tp_threads']} | "
                         f"{s['llama_tokens_per_s']:.2f} | — | — | — | {verdict} |")
            continue
        tv = ""
        if tgt:
            short = (tgt - s["ratio"]) / tgt * 100
            tv = f"≥ {tgt} — " + ("met" if s["ratio"] >= tgt else f"missed by {short:.0f} %")
        lines.append(f"| {s['dtype']} | {name} | {s['threads']} | TP={s['tp']}x{s['tp_threads']} | "
                     f"{s['llama_tokens_per_s']:.2f} | {s['tensorpar_tokens_per_s']:.2f} | **{s['ratio']:.2f}** | "
                     f"{s['ratio_min']:.2f}–{s['ratio_max']:.2f} | {tv} |")
    return "\n".join(lines)


def report(summary, info, a):
    m = info["machine"]
    ll = info.get("llama_bench", {})
    text = [f"Run of {info['started']}–{info['ended']} UTC: `bash bench/llamacpp/run.sh {info['args']}`; "
            f"model {info['model_name']} ({info['arch']}), {a.rounds} round(s); load average "
            f"{info['load_min']:.2f}–{info['load_max']:.2f} over the launches"
            f"{' (QUICK: a plumbing check, not a measurement)' if a.quick else ''}.",
            "",
            f"* CPU: {m['cpu']}, {m['cores']} cores; flags {', '.join(m['flags']) or 'none of avx2/avx512'}.",
            f"* tensorpar: kernel path `{info['tensorpar_isa']}` ({info['tensorpar_rev']}).",
            f"* llama.cpp {ll.get('build_commit', '?')} (node-llama-cpp@3.22.1's bundle), backend "
            f"{ll.get('backends', '?')}, KV cache {ll.get('type_k', '?')}/{ll.get('type_v', '?')}, flash attention "
            f"{ {-1: 'auto', 0: 'off', 1: 'on'}.get(ll.get('flash_attn'), ll.get('flash_attn'))}, batch {ll.get('n_batch', '?')}/{ll.get('n_ubatch', '?')}; "
            f"built with: `{info['llama_system_info']}`.",
            "* Ratios are tensorpar's tokens/s over llama.cpp's, each taken within one round; tok/s columns "
            "are each side's median over the rounds.",
            "", table(summary, info, a)]
    for d, why in info["refused"].items():
        where = d if isinstance(d, str) else f"{d[0]} at TP={d[1][0]}x{d[1][1]}"
        text.append(f"\n{where}: tensorpar refused it (`{why}`), so only llama.cpp's figure is shown.")
    return "\n".join(text)


BEGIN, END = "<!-- llamacpp:begin (written by bench/llamacpp/run.sh) -->", "<!-- llamacpp:end -->"


def write_readme(path, body):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{path} has no {BEGIN} ... {END} section to rewrite")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + BEGIN + "\n" + body + "\n" + END + tail)


def chart(summary, info, a, png):
    data = png + ".dat"
    with open(data, "w") as f:
        for s in summary:
            if s["ratio"] is not None:
                lab = f"{s['dtype']} {s['test']} TP={s['tp']}x{s['tp_threads']}"
                f.write(f"\"{lab}\" {s['ratio']:.4f} {s['ratio_min']:.4f} {s['ratio_max']:.4f}\n")
    title = f"tensorpar / llama.cpp tokens/s, {info['model_name']}, pp{a.pp} and tg{a.tg}, {info['machine']['cpu']}"
    with open(os.path.join(HERE, "chart.gp")) as f:
        body = f.read()
    # pngcairo draws better; the plain png terminal is the fallback
    for term in ("pngcairo", "png"):
        script = (f"term = '{term}'\nout = '{png}'\ndata = '{data}'\n"
                  f"title_text = '{title.replace(chr(39), '')}'\n" + body)
        p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if p.returncode == 0:
            break
    os.remove(data)
    if p.returncode:
        print(f"gnuplot failed: {p.stderr.strip()}", file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description="the rounds of bench/llamacpp/run.sh")
    ap.add_argument("--tensorpar", required=True)
    ap.add_argument("--llama-bin", required=True, help="folder of llama-bench")
    ap.add_argument("--model", required=True, help="the Hugging Face checkpoint tensorpar loads")
    ap.add_argument("--gguf", action="append", default=[], help="DTYPE=FILE, the same weights for llama.cpp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="bf16,f32,q8_0")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp-reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--args", default="", help="the run.sh arguments, for the report")
    ap.add_argument("--out", required=True, help="folder for results.json and report.md")
    ap.add_argument("--readme", help="rewrite this file's marked section with the report")
    ap.add_argument("--png", help="draw the ratio chart here")
    a = ap.parse_args()
    a.threads = [int(t) for t in a.threads.split(",")]
    a.dtypes = a.dtypes.split(",")
    a.gguf = dict(x.split("=", 1) for x in a.gguf)
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    isa = subprocess.run([a.tensorpar, "--isa-list"], capture_output=True, text=True, env=bench_env()).stdout
    rev = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True, text=True)
    info = {"started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "args": a.args, "arch": cfg["model_type"],
            "model_name": os.path.basename(os.path.normpath(a.model)), "machine": cpu_summary(),
            "tensorpar_isa": next((ln.split()[0] for ln in isa.splitlines() if "(chosen)" in ln), "?"),
            "tensorpar_rev": (rev.stdout.strip() or "?"), "llama_system_info": llama_system_info(a.llama_bin)}
    log(f"== {info['machine']['cpu']}; tensorpar path {info['tensorpar_isa']}; llama.cpp: {info['llama_system_info']}")
    rows, refused = measure_rounds(a, log)
    info["ended"] = time.strftime("%H:%M", time.gmtime())
    info["refused"] = refused
    info_json_refused = {k if isinstance(k, str) else f"{k[0]} TP={k[1][0]}x{k[1][1]}": v for k, v in refused.items()}
    info["load_min"] = min(r["load"] for r in rows)
    info["load_max"] = max(r["load"] for r in rows)
    info["llama_bench"] = next(r["info"] for r in rows if r["side"] == "llama")
    summary = summarise(a, rows, refused)
    body = report(summary, info, a)
    if a.png and chart(summary, info, a, a.png):
        body += f"\n\n![tensorpar / llama.cpp]({os.path.relpath(a.png, os.path.dirname(a.readme)) if a.readme else a.png})"
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"info": dict(info, refused=info_json_refused), "summary": summary, "measurements": rows}, f,
                  indent=1)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(body + "\n")
    if a.readme:
        write_readme(a.readme, body)
    print("\n" + body)


if __name__ == "__main__":
    main()
