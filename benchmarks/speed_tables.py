"""The tables of speed, memory and the detection service: docs/results.md's "How fast is it?", docs/scaling.md and
docs/security.md. Each is a function from the results folder to markdown lines (render.py)."""

from __future__ import annotations

from pathlib import Path

from common import read, table


def embed_stages(root: Path) -> list[str]:
    """Seconds and peak RSS of each stage of one embed (embed_stages.json)."""
    r = read(root / "embed_stages.json")
    rows = [[k, f"{s:.1f}", f"{r['stage_peak_rss_mb'][k]:.0f}"] for k, s in r["stage_seconds"].items()]
    return table([f"stage ({r['profile']} profile, {r['n_states']} states)", "seconds", "peak RSS (MB)"], rows)


def generate_speed(root: Path) -> list[str]:
    """Sampling speed and the completions' NLL under the float32 model, per sampler (generate_speed.json)."""
    r = read(root / "generate_speed.json")
    nll = r["completion_nll_float32_model"]
    rows = [
        [
            k,
            f"{r['seconds'][k]:.1f}",
            f"{tps:.0f}",
            f"{nll[k]['mean']:.3f} [{nll[k]['ci'][0]:.3f}, {nll[k]['ci'][1]:.3f}]",
        ]
        for k, tps in r["sampled_tokens_per_s"].items()
    ]
    rows.append(
        [
            "plain forward (scoring)",
            f"{r['seconds']['plain_forward']:.1f}",
            f"{r['plain_forward_tokens_per_s']:.0f}",
            "-",
        ]
    )
    s = r["settings"]
    return table([f"{s['n']} x {s['new_tokens']} tokens", "seconds", "tokens/s", "NLL under float32 [95% CI]"], rows)


def serve_load(root: Path) -> list[str]:
    """The HTTP service under concurrent clients, batched and not (serve_load.json)."""
    r = read(root / "serve_load.json")
    rows = [
        [str(s["max_batch"]), f"{s['texts_per_second']:.2f}", f"{s['tokens_per_second']:.0f}"]
        + [
            f"{s['latency_p50_s']:.1f}",
            f"{s['latency_p99_s']:.1f}",
            str(s["errors"]),
            f"{s['server_memory_mb']['VmHWM']:.0f}",
        ]
        for s in (r["batched"], r["max_batch_1"])
    ]
    header = ["max batch", "texts/s", "tokens/s", "latency p50 (s)", "p99 (s)", "errors", "server peak RSS (MB)"]
    return table(header, rows, 0)


def ray_detect(root: Path) -> list[str]:
    """Batch detection on a local Ray against detection in process (ray_detect.json)."""
    r = read(root / "ray_detect.json")
    inp = r["in_process"]
    rows = [["in process", f"{inp['detect_s']:.1f}", f"{inp['tokens_per_s']:.0f}", "1.00"]]
    for n, s in r["ray"].items():
        rows.append([f"Ray, {n} actor(s)", f"{s['wall_s']:.1f}", f"{s['tokens_per_s']:.0f}"])
        rows[-1].append(f"{r['overhead_vs_in_process'][n]:.2f}")
    header = [f"{r['texts']} texts, {r['tokens']} tokens, {r['cpus']} CPUs", "seconds", "tokens/s", "x in-process time"]
    return table(header, rows)


def key_memory(root: Path) -> list[str]:
    """Peak memory and time of fitting the selector, in memory and over shards (key_memory.json)."""
    r = read(root / "key_memory.json")
    rows = [
        [p["mode"], str(p["n_states"]), f"{p['peak_rss_mb']:.0f}", f"{p['above_model_mb']:.0f}", f"{p['seconds']:.0f}"]
        for p in r["points"]
    ]
    return table(["states", "n", "peak RSS (MB)", "above the model (MB)", "seconds"], rows)


def kmeans_backends(root: Path) -> list[str]:
    """scikit-learn's k-means against torch's on the same states (kmeans_backends.json)."""
    r = read(root / "kmeans_backends.json")
    rows = [
        [
            b["kmeans"],
            f"{b['wall_s']:.1f}",
            f"{b['train_accuracy']:.3f}",
            f"{b['heldout_accuracy']:.3f}",
            f"{b['inertia_per_state']:.1f}",
        ]
        for b in r["backends"].values()
    ]
    header = [f"k-means ({r['states_train']} states, {r['lists']} lists, {r['threads']} thread)", "seconds"]
    return table(header + ["selector train accuracy", "held out", "inertia per state"], rows)


def key_rebuild(root: Path) -> list[str]:
    """A key rebuilt from its seed: on the machine that built it, per thread count (key_rebuild.json), and on
    another machine from an eval's record of its digest (key_rebuild_from_results.json)."""
    rows = []
    r = read(root / "key_rebuild.json")
    for x in r["rows"]:
        gap = f"largest difference {max(x['max_abs_difference'].values()):.1e}"
        rows.append([f"{r['method']} seed {r['settings']['seed']}, {r['cpu']}", gap, str(x["threads"])])
        rows[-1].append(f"{x['seconds']:.0f}")
    e = read(root / "key_rebuild_from_results.json")
    for x in e["rows"]:
        same = "sha256 identical to the eval's" if x["identical"] else "sha256 differs from the eval's"
        rows.append([f"{e['method']} seed {e['settings']['seed']}, {e['cpu']}", same, str(x["threads"])])
        rows[-1].append(f"{x['seconds']:.0f}")
    return table(["key rebuilt", "against the original", "threads", "seconds"], rows, 2)


def serve_bad_inputs(root: Path) -> list[str]:
    """Malformed and oversized requests to the service, grouped by the status it answered (serve_bad_inputs.json)."""
    r = read(root / "serve_bad_inputs.json")
    by: dict[int, list[str]] = {}
    for q in r["requests"]:
        by.setdefault(q["status"], []).append(q["request"])
    rows = [[str(s), "; ".join(q), str(len(q))] for s, q in sorted(by.items())]
    alive = all(q["server_alive_after"] for q in r["requests"])
    echoed = sum(q["text_echoed"] for q in r["requests"])
    rows.append(
        ["5xx", f"server alive after every request: {alive}; texts echoed: {echoed}", str(r["server_errors_5xx"])]
    )
    return table(["status", "requests", "how many"], rows, 2)
