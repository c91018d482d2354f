"""The comparison pipeline: prompts -> keys -> generations -> scores -> perplexity -> metrics -> report.

Each stage writes its output under the run directory and is skipped when that output exists,
so a killed run resumes where it stopped and re-scoring or re-rendering never regenerates.

    run/
      config.json                 the resolved EvalConfig
      data/prompts.json           prompt and human-continuation token ids, document ids
      keys/<method>/s<seed>/      each method's key, and settings.json: a key built with other settings is refused
      generations/<run>/b*.json   completions, one file per batch
      scores/<run>.json           the run's detector on watermarked, human and unwatermarked text
      scores/lengths/<run>.json   the same on watermarked and human text cut to each of cfg.lengths
      ppl/<set>.json              oracle perplexities
      own_ppl/<set>.json          the generating model's own NLL on the human continuations
      downstream/<set>.json       its per-item accuracy on the lm-eval tasks of cfg.downstream
      timings.json                seconds per stage of every invocation (a resumed stage costs ~0)
      results.json, samples.jsonl, report.md, *.png

Keys and generation batches are also kept in a store shared by every eval (:mod:`openstamp.lab.evaluation.store`),
by the digest of what made them: another run folder that needs the same key or batch takes it from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from openstamp.corpus import load_documents, split_documents
from openstamp.lab.evaluation.config import RECORDED_BEFORE, RESOLVED_DTYPES, EvalConfig
from openstamp.lab.evaluation.lengths import run_lengths, score_lengths
from openstamp.lab.evaluation.report import write_report
from openstamp.lab.evaluation.results import collect_results, load_generations
from openstamp.lab.evaluation.scoring import score_downstream, score_own_ppl, score_perplexity, score_run
from openstamp.lab.evaluation.store import EvalStore, digest, folder_digest
from openstamp.lab.evaluation.timings import StageClock
from openstamp.lab.generators import export_for_vllm, select_generator, vllm_completions
from openstamp.lab.hidden import HiddenCache, autocast_decoder, reusing
from openstamp.lab.methods import REGISTRY, Carrier, WatermarkMethod
from openstamp.lab.methods.common import key_digest
from openstamp.model.generate import sample_completions
from openstamp.model.load import fast_dtype, load_model, sampling_copy
from openstamp.model.patch import tensor_sha256
from openstamp.model.text import bos_prefix, prompt_windows
from openstamp.storage import atomic_write_json, changed_fields, changed_settings, differences, read_json

log = logging.getLogger(__name__)


def run_eval(
    cfg: EvalConfig, out: Path, progress: bool = True, generator: str = "transformers", store: EvalStore | None = None
) -> dict:
    """Run (or resume) the comparison described by ``cfg`` into ``out``; return results.json's content.

    ``generator``: transformers, vllm or auto (see :mod:`openstamp.lab.generators`); vLLM samples the
    unwatermarked and weight-level sets, decode-time methods always use transformers. ``store``: where keys
    and generation batches are shared with other evals (:func:`openstamp.lab.evaluation.store.open_store`).
    """
    choice = select_generator(generator)
    log.info("generator: %s (%s)", choice.name, choice.reason)
    if not cfg.methods:  # the default: every registered method, recorded by name in config.json
        cfg = dataclasses.replace(cfg, methods=tuple(REGISTRY))
    for name in RESOLVED_DTYPES:  # recorded as resolved: a run resumed elsewhere runs alike or stops
        if getattr(cfg, name) == "fast":
            cfg = dataclasses.replace(cfg, **{name: fast_dtype(cfg.device)})
    _check_lengths(cfg)
    _check_config(cfg, out)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
    untimed = (out / "generations").exists() and not (out / "timings.json").exists()  # a run begun before timings
    clock = StageClock(out, started, untimed)
    runs, windows = _stages(cfg, out, progress, choice, clock, store)  # an interrupted one keeps its seconds too
    timings = clock.save()
    results = collect_results(out, cfg, runs, windows)
    results["timings_s"] = timings
    atomic_write_json(out / "results.json", results)

    write_report(out)
    return results


def _stages(cfg: EvalConfig, out: Path, progress: bool, choice, clock: StageClock, store):
    """Keys, generations, own perplexity, downstream, scores, lengths and the oracle; each stage timed by ``clock``,
    with what each method's runs spent.

    Returns the runs and the prompt windows.
    """
    with clock.stage("load"):
        model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
        key_docs = split_documents(load_documents(cfg.key_corpus), "key")
        windows = load_windows(cfg, tokenizer, {d.sha256 for d in key_docs}, out)
        if store is not None:  # what a key or a batch is made from, besides the method: the model and its data
            head = tensor_sha256(model.get_output_embeddings().weight)
            store.made_from = {"model": [cfg.model, cfg.dtype, cfg.device, head], "docs": [d.sha256 for d in key_docs]}
    prompts = [w["prompt"] for w in windows]
    # the original model's hidden states of the human and unwatermarked texts, computed once: every detector scores
    # with them, and the own perplexity of a watermark that leaves the decoder alone (keeps_hidden) starts from them
    hidden = HiddenCache()
    with clock.stage("own_ppl"), reusing(hidden), autocast_decoder(cfg.own_ppl_dtype):
        score_own_ppl(out, "original", model, tokenizer, windows, None, cfg, progress)
    with clock.stage("downstream"):
        score_downstream(out, "original", model, tokenizer, None, cfg)
    runs, keys = [], {}  # keys: each method's one key per seed, shared by its strengths
    memos: dict[tuple, dict] = {}  # per shared key whose scores ignore the strength: each text's scores, once
    for seed in cfg.seeds:
        with clock.stage("generate"):
            name = f"unwatermarked/s{seed}"
            generate_set(out, name, model, tokenizer, prompts, cfg, seed, None, progress, choice, store, [None])
        for name in cfg.methods:
            for strength in strengths(cfg, name):
                with clock.run(name):
                    with clock.stage("keys"):
                        variant = keyed_variant(out, name, seed, cfg, model, tokenizer, key_docs, strength, keys, store)
                    run = f"{name}@{strength:g}/s{seed}"
                    gen_name = generation_name(variant, strength, seed)
                    key_dir = key_directory(out, cfg, name, seed, strength)
                    if variant.carrier is Carrier.WEIGHTS:
                        variant.apply(model)
                    try:
                        with clock.stage("generate"):
                            processor = variant.logits_processor()  # a fresh one per use: some keep state
                            args = (out, gen_name, model, tokenizer, prompts, cfg, seed, processor, progress, choice)
                            generate_set(*args, store, store and [variant.describe(), folder_digest(key_dir)])
                        with (
                            clock.stage("own_ppl"),
                            reusing(hidden) if variant.keeps_hidden else contextlib.nullcontext(),
                            autocast_decoder(cfg.own_ppl_dtype),
                        ):
                            processor = variant.logits_processor()
                            score_own_ppl(out, gen_name, model, tokenizer, windows, processor, cfg, progress)
                        with clock.stage("downstream"):
                            processor = variant.logits_processor()
                            score_downstream(out, gen_name, model, tokenizer, processor, cfg)
                    finally:
                        if variant.carrier is Carrier.WEIGHTS:
                            variant.revert(model)
                    memo = memos.setdefault((name, seed), {}) if variant.shares_statistics else None
                    with clock.stage("score"), reusing(hidden), autocast_decoder(cfg.score_dtype):
                        score_run(out, run, gen_name, variant, model, tokenizer, windows, seed, cfg, memo)
                    with clock.stage("lengths"), reusing(hidden), autocast_decoder(cfg.score_dtype):
                        human = [w["human"] for w in windows]
                        lengths = run_lengths(cfg.lengths, cfg.new_tokens)
                        ids = load_generations(out, gen_name)
                        batch = cfg.score_batch_size
                        score_lengths(out, run, variant, model, tokenizer, ids, human, lengths, batch, memo)
                    runs.append(
                        {
                            "run": run,
                            "method": name,
                            "strength": strength,
                            "seed": seed,
                            "generations": gen_name,
                            "settings": variant.describe(),
                            "key_sha256": key_digest(key_dir),
                        }
                    )
    if cfg.oracle != "none":
        del model
        with clock.stage("oracle"):
            score_perplexity(out, cfg, tokenizer, windows, runs, progress)
    return runs, windows


def _check_lengths(cfg: EvalConfig) -> None:
    """Refuse, before any work, completions too short for a method's detector to score (no text would get a score)."""
    scored = cfg.new_tokens - 1  # the first token has no context
    for name in cfg.methods:
        least = getattr(configured(name, cfg).config, "min_tokens", 0)
        if scored < least:
            raise ValueError(
                f"{name} scores texts of at least {least} tokens (min_tokens), and --new-tokens {cfg.new_tokens} "
                f"gives {scored} scored tokens (the first has no context): raise --new-tokens to {least + 1} or more, "
                f'or lower {name}\'s min_tokens (--set \'method_settings={{"{name}": {{"min_tokens": {scored}}}}}\')'
            )


GROWS = ("seeds", "methods")  # a run may grow by these: what it already holds is re-used
RESCORED = ("oracle_dtype",)  # may change: the files record what they ran with, and the stage re-scores the rest


def _check_config(cfg: EvalConfig, out: Path) -> None:
    """Refuse a run directory written with other settings; a field added since, at the value such runs had
    (``RECORDED_BEFORE``, else its default), still matches.

    A run may grow: more seeds or more methods than the folder holds re-use every finished stage
    (the new config is recorded); dropping one is a change like any other. A field in RESCORED may change.
    """
    path = out / "config.json"
    if not path.exists() and (out / "results.json").exists():
        raise ValueError(
            f"{out} holds results but no run (merged ones, from `openstamp merge-runs`); choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    wanted = asdict(cfg)
    kept = lambda d: {k: v for k, v in d.items() if k not in RESCORED}  # noqa: E731
    raw = read_json(path, "run config") if path.exists() else wanted
    stored = kept(EvalConfig.recorded(raw))  # a field added since takes the value such runs had
    if stored["method_names"] != cfg.method_names:
        if not stored["methods"] or {"openstamp", "openstamp-nosem"} & set(stored["methods"]):
            raise ValueError(
                f"{out} was made before 0.3.0 renamed OpenStamp's methods (openstamp-nosem is openstamp now, and "
                "openstamp is openstamp-projected); its keys and texts are kept under the old names: choose another "
                "--out (its results.json still reads: old names are mapped where results are read)"
            )
        stored["method_names"] = cfg.method_names  # no renamed method in the run: its files hold as they are
    if changed := differences(stored, kept(wanted), GROWS):
        named = lambda k: k in raw or k in RECORDED_BEFORE  # noqa: E731
        again = [k for k in changed_fields(stored, kept(wanted), GROWS) if named(k) and k not in GROWS]
        hint = " ".join(_set_option(k, stored[k]) for k in again)
        raise ValueError(
            f"{out} holds a run with different settings ({changed}); choose another --out or delete it"
            + (f", or resume it as it was made: add {hint}" if hint else "")
        )
    atomic_write_json(path, wanted)


def _set_option(name: str, value) -> str:
    """The ``--set`` option that gives a setting this value (a default may have changed since a run was made)."""
    return f"--set '{name}={value if isinstance(value, str) else json.dumps(value)}'"


def load_windows(cfg: EvalConfig, tokenizer, exclude: set[str], out: Path) -> list[dict]:
    """``n`` prompt windows with their human continuations, from documents no key was built on."""
    path = out / "data" / "prompts.json"
    if path.exists():
        return read_json(path, "prompt cache")
    groups = []
    for spec in [c.strip() for c in cfg.corpus.split(",") if c.strip()]:
        docs = [d for d in load_documents(spec) if d.sha256 not in exclude]
        if spec == cfg.key_corpus:
            docs = split_documents(docs, "heldout")
        pairs = prompt_windows(tokenizer, [d.text for d in docs], cfg.prompt_tokens, cfg.new_tokens)
        groups.append([{"corpus": spec, "prompt": p, "human": h} for p, h in pairs])
    mixed = [w for row in _interleave(groups) for w in row]
    if len(mixed) < cfg.n:
        sizes = ", ".join(f"{len(g)} in {g[0]['corpus'] if g else '?'}" for g in groups)
        raise ValueError(
            f"the prompt corpora hold {len(mixed)} windows of {cfg.prompt_tokens}+{cfg.new_tokens} "
            f"tokens ({sizes}), fewer than n={cfg.n}; add a corpus (e.g. --corpus news,wikipedia)"
        )
    windows = mixed[: cfg.n]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, windows)
    return windows


def _interleave(groups: list[list]) -> list[list]:
    longest = max(map(len, groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]


def configured(name: str, cfg: EvalConfig, strength: float | None = None) -> WatermarkMethod:
    """A method without its key, with the run's settings (and ``strength``, if given)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    settings = dict(cfg.method_settings.get(name, {}))
    if strength is not None:
        settings[cls.strength] = strength
    return cls(cls.config_class(**settings))


def key_directory(out: Path, cfg: EvalConfig, name: str, seed: int, strength: float | None = None) -> Path:
    """keys/<method>/s<seed>; a key trained at another strength than the default: keys/<method>@<strength>/s<seed>."""
    other = (
        strength is not None and REGISTRY[name].key_per_strength and strength != configured(name, cfg).strength_value
    )
    return out / "keys" / (f"{name}@{strength:g}" if other else name) / f"s{seed}"


def keyed_method(out, name, seed, cfg, model, tokenizer, docs, strength=None, store=None) -> WatermarkMethod:
    """Build a method's key for this seed (at ``strength`` for a key trained at one), or load it from the run, or
    take it from the ``store``."""
    method = configured(name, cfg, strength)
    directory = key_directory(out, cfg, name, seed, strength)
    settings = asdict(method.config)
    ident = store and digest("key", name, settings, seed, store.made_from)
    if store is not None and not (directory / "done").exists():
        store.fetch_key(ident, directory)
    if (directory / "done").exists():
        # settings.json is absent from runs begun before keys recorded their settings: nothing to compare; a field
        # added to the method since the key was built takes the value such keys were built with (added_settings:
        # KGW-distilled's autocast was float32), else its value now
        built = {**settings, **method.added_settings}
        if changed := changed_settings(directory / "settings.json", settings, "key settings", built):
            raise ValueError(
                f"{directory} was built with other {name} settings ({changed}); a default may have changed since: "
                "choose another --out, or move that method's files out of the run"
            )
        method.load(directory)
        return method
    log.info("building the %s key for seed %d (%s)", name, seed, directory.parent.name)
    start = time.perf_counter()
    method.build(model, tokenizer, docs, seed)
    log.info("built the %s key for seed %d in %.0f s", name, seed, time.perf_counter() - start)
    directory.mkdir(parents=True, exist_ok=True)
    method.save(directory)
    atomic_write_json(directory / "settings.json", settings)
    (directory / "done").write_text("")
    if store is not None:
        store.keep_key(ident, directory)
    return method


def keyed_variant(out, name, seed, cfg, model, tokenizer, docs, strength: float, keys: dict, store=None):
    """The method at ``strength`` with its key: a key trained at that strength (``key_per_strength``: one key
    each), else the seed's one key, built or loaded once into ``keys``, at that strength."""
    if REGISTRY[name].key_per_strength:
        return keyed_method(out, name, seed, cfg, model, tokenizer, docs, strength, store)
    if (name, seed) not in keys:
        keys[name, seed] = keyed_method(out, name, seed, cfg, model, tokenizer, docs, store=store)
    return keys[name, seed].with_strength(strength)


def strengths(cfg: EvalConfig, name: str) -> list[float]:
    method = configured(name, cfg)
    if cfg.sweep:
        return [float(v) for v in cfg.grids.get(name, method.sweep)]
    return [float(cfg.strengths.get(name, method.strength_value))]


def generation_name(method: WatermarkMethod, strength: float, seed: int) -> str:
    """Methods that generate alike (KGW scored two ways) share their generations."""
    return f"{method.generation_family}@{strength:g}/s{seed}"


def generate_set(
    out, name, model, tokenizer, prompts, cfg, seed, processor, progress, generator=None, store=None, made=None
) -> list[list[int]]:
    """Completions of every prompt, generated batch by batch; finished batches are kept on disk.

    With a vLLM ``generator`` and no logits processor (a weight-level watermark or none), the
    model as it is now is saved and the missing batches are sampled by vLLM in one call. With a ``store``,
    a batch is taken from it where kept, and kept there once sampled; ``made`` says what else makes the set
    (the method's settings and its key files' digest; [None] for the unwatermarked model). Transformers samples
    from a copy of the model cast to ``cfg.sample_dtype`` (:func:`openstamp.model.load.sampling_copy`).
    """
    directory = out / "generations" / name
    directory.mkdir(parents=True, exist_ok=True)
    vllm = generator is not None and generator.is_vllm and processor is None
    if vllm:
        _generate_vllm(out, directory, model, tokenizer, prompts, cfg, seed)
    store = None if vllm else store
    sampling = [cfg.new_tokens, cfg.temperature, cfg.top_p]
    if cfg.sample_dtype != "float32":  # float32 batches keep the digest they had before the field
        sampling.append(cfg.sample_dtype)
    sampler = None  # the model cast to sample_dtype, made once a batch needs sampling
    completions: list[list[int]] = []
    for b, start in enumerate(range(0, len(prompts), cfg.batch_size)):
        path = directory / f"b{b:04d}.json"
        batch = prompts[start : start + cfg.batch_size]
        ident = None
        if store is not None and not path.exists():  # digest only what the run folder lacks
            ident = digest("generation", made, store.made_from["model"], batch, sampling, seed * 100_003 + b)
            if (ids := store.batch(ident)) is not None:
                atomic_write_json(path, ids)
        if not path.exists():
            if progress:
                log.info("generating %s: batch %d of %d", name, b + 1, -(-len(prompts) // cfg.batch_size))
            if sampler is None:
                sampler = sampling_copy(model, cfg.sample_dtype)
            ids = sample_completions(
                sampler,
                tokenizer,
                batch,
                cfg.new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                seed=seed * 100_003 + b,
                batch_size=cfg.batch_size,
                logits_processor=processor,
                progress=False,
            )
            atomic_write_json(path, ids)
            if store is not None:
                store.keep_batch(ident, ids)
        completions.extend(read_json(path, "generation batch"))
    return completions


def _generate_vllm(out, directory, model, tokenizer, prompts, cfg, seed) -> None:
    starts = [s for s in range(0, len(prompts), cfg.batch_size)]
    missing = [(b, s) for b, s in enumerate(starts) if not (directory / f"b{b:04d}.json").exists()]
    if not missing:
        return
    model_dir = export_for_vllm(model, tokenizer, out / "vllm-model")
    try:
        todo = [bos_prefix(tokenizer) + p for _, s in missing for p in prompts[s : s + cfg.batch_size]]
        ids = vllm_completions(
            model_dir, todo, cfg.new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=seed * 100_003
        )
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)  # the next set may be another variant of the weights
    for b, s in missing:
        n = len(prompts[s : s + cfg.batch_size])
        atomic_write_json(directory / f"b{b:04d}.json", ids[:n])
        ids = ids[n:]
