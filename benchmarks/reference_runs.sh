#!/usr/bin/env bash
# The runs behind docs/results.md: one stage per section, each writing that section's JSON under benchmarks/results/
# (`python benchmarks/render.py` then renders the tables), on the packaged SmolLM2-135M at the scale a 2-core CPU
# allows.
#
#   bash benchmarks/reference_runs.sh                    # every stage, in order (days on 2 CPU cores)
#   bash benchmarks/reference_runs.sh frontier lengths   # chosen stages
#
# Stages: frontier (what it costs and buys), lengths (how short a text can be), fpr (the false-positive rate per key),
# paraphrase, durability (quantization, merging, pruning, fine-tuning), speed, settings (which strength), losses
# (where OpenStamp loses), qwen_frontier (the frontier on the second model, Qwen2.5-Coder-0.5B, then paraphrase on it:
# qwen_paraphrase, which runs alone too). paraphrase and durability attack the sweep's evals, which frontier leaves in
# runs/. durability_equal, the end of durability (the shipping default at equal cost, on evals of its own), runs alone.
#
# Every command resumes where it stopped when run again, and each result is copied into benchmarks/results/ when its
# stage has made it. Logs go to runs/logs/<stage>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENSTAMP=${OPENSTAMP:-.venv/bin/openstamp}
PY=${PY:-.venv/bin/python}
mkdir -p runs/logs

cold_eval() {
  # $1 the run folder, $2 where its results, report and timings are kept: `openstamp eval --n 200`, every method, with
  # an eval store of the run's own ($1-store), empty at first, so every key, completion and score is made in it
  $OPENSTAMP eval --model smollm2-135m --n 200 --store $1-store --out $1
  mkdir -p $2
  cp $1/results.json $1/report.md $1/timings.json $2/
}

timed_again() {
  # the timed default comparison again, from a cold start as the lengths stage runs it (a run folder and an eval store
  # of its own, empty at first), to measure what later code costs; kept in eval_timed/rerun/ beside the first, which
  # threshold_lengths.py reads, with the commit it ran (made.json): TIMED_AGAIN=1 bash benchmarks/reference_runs.sh lengths
  local T=runs/eval-timed2 K=benchmarks/results/eval_timed/rerun
  local commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+changes")
  cold_eval $T $K
  printf '{"commit": "%s", "command": "TIMED_AGAIN=1 bash benchmarks/reference_runs.sh lengths"}\n' "$commit" > $K/made.json
}

tune_key() {
  # $1 the key folder, $2 the results name (benchmarks/results/$2.json), then any other tune options: the smallest
  # delta whose 64-token texts are flagged 95% of the time at p <= 0.01, and what it costs
  local key=$1 name=$2
  shift 2
  $OPENSTAMP tune --model smollm2-135m --corpus wikipedia --target-tpr 0.95 --tokens 64 --fpr 0.01 --n 32 \
    --key $key --overwrite "$@"
  mkdir -p benchmarks/results
  $PY -c "import json; from openstamp.storage import atomic_write_json; m = json.load(open('$key/key.json')); \
atomic_write_json('benchmarks/results/$name.json', {'command': 'openstamp tune (benchmarks/reference_runs.sh settings)', \
'versions': m['versions'], 'key_id': m['key_id'], 'selector_shrinkage': m['config']['selector'].get('shrinkage', 0.0), \
**m['tune']})"
}

# the Pareto sweep's methods and strengths: 4 per method, the weakest below TPR 1 at 64 tokens. KGW-distilled is left
# out: one 28-min distillation per strength and seed
SWEEP=(--model smollm2-135m --methods openstamp,openstamp-nosem,unremovable,gaussmark,kgw,kgw-llr,sir --sweep --set
  'grids={"openstamp": [0.25, 0.5, 0.75, 1.0], "openstamp-nosem": [0.25, 0.5, 0.75, 1.0],
    "unremovable": [0.2, 0.4, 0.6, 0.8], "gaussmark": [0.1, 0.2, 0.3, 0.4], "kgw": [0.5, 1.0, 1.5, 2.0],
    "kgw-llr": [0.5, 1.0, 1.5, 2.0], "sir": [0.25, 0.5, 0.75, 1.0]}' --n 200 --new-tokens 64 --set lengths=16,32)


merge_kept() {
  # $1 the folder of kept seeds (s<seed>/results.json), $2 the merge's run folder, $3 where the merge is kept, then
  # the seeds: once every one is kept they are merged (openstamp merge-runs, with $MERGE_OPTIONS) and the merge kept;
  # else the last stands
  local seeds=$1 run=$2 dest=$3 kept=()
  shift 3
  for seed in "$@"; do
    [ -f $seeds/s$seed/results.json ] || return 0
    kept+=($seeds/s$seed/results.json)
  done
  $OPENSTAMP merge-runs "${kept[@]}" --out $run ${MERGE_OPTIONS:-}
  cp $run/results.json $run/report.md $run/*.png $dest/
}

sweep() {
  # the Pareto sweep (the paper's Figure 2) where the methods separate: 64 new tokens, n 200 per point. Each seed
  # runs in its own folder (a shard) from an eval store of its own, empty at first, so every key, completion and
  # score is made in it and its timings_s is the seed's whole cost (the issue's goal: the 3 seeds in 3 h); seeds can
  # run in separate sessions or on separate machines. A finished seed is kept with its scores under
  # benchmarks/results/sweep/seeds/, and once seeds 0, 1 and 2 are all kept they are merged into
  # benchmarks/results/sweep/ (openstamp merge-runs). To run the sweep again with other code, first move that merge
  # and its seeds/ into a folder under it named for what changed (as float32_own_ppl/).
  # SWEEP_SEEDS="2" runs one seed.
  local seeds=benchmarks/results/sweep/seeds all=(0 1 2)
  for seed in ${SWEEP_SEEDS:-${all[@]}}; do
    [ ! -f $seeds/s$seed/results.json ] || continue  # kept: this seed is done
    $OPENSTAMP eval "${SWEEP[@]}" --seeds $seed --store runs/sweep-s$seed-store --out runs/sweep-s$seed
    mkdir -p $seeds/s$seed
    cp runs/sweep-s$seed/results.json runs/sweep-s$seed/report.md $seeds/s$seed/
  done
  merge_kept $seeds runs/sweep-merged benchmarks/results/sweep "${all[@]}"
}

sweep_eval() {
  # the sweep's eval of seed SWEEP_EVAL_SEED (default 0) in runs/sweep-s<seed>, for the stages that attack it
  # (paraphrase_cost, robust_cost, durability_cost), run again without touching the kept seeds: sweep() skips a kept
  # seed, and on another CPU the run is not the kept one (trained keys and sampled text differ). About 50 min on a
  # quiet 2-core machine
  local seed=${SWEEP_EVAL_SEED:-0}
  $OPENSTAMP eval "${SWEEP[@]}" --seeds $seed --store runs/sweep-s$seed-store --out runs/sweep-s$seed
}

shrinkage() {
  # an OpenStamp method (SHRINK_METHOD: openstamp, the default, or openstamp-nosem) with selector shrinkage f
  # (selector.shrinkage: ridge lambda = f * tr(Z^T Z) / d; on 32 prompts, a finished low-strength study found it buys TPR
  # at equal cost) on the sweep's prompts, human text and seeds, each seed a shard from an empty store as in sweep();
  # once seeds 0, 1 and 2 are kept they are merged into benchmarks/results/shrinkage/<method>-f<f>/, whose points render.py
  # reads against the sweep's curves at equal cost. SHRINK_F (default 4) chooses f, SHRINK_SEEDS="0" runs
  # one seed. About 15 min a seed on 2 cores. Shrinkage raises the cost of a delta (OpenStamp's seed 0 at f 4: +5.8%
  # own PPL at 0.25, +25% at 0.5, +68% at 0.75, against +2.9%, +12% and +31% unshrunk), so its grid stops at 0.5 to
  # cover the baselines' cost range (their costliest +26..+40%)
  # SHRINK_CENTRE=1 also centres dW (green.centre; the folder gets -centred); SHRINK_GAMMA=g sets the green-list
  # fraction (default 0.25; another gets -g<g>)
  local m=${SHRINK_METHOD:-openstamp} f=${SHRINK_F:-4} all=(0 1 2) grid=${SHRINK_GRID:-0.125, 0.25, 0.375, 0.5}
  local centre=false tag="" gamma=""
  if [ "${SHRINK_CENTRE:-0}" = 1 ]; then centre=true tag=-centred; fi
  if [ "${SHRINK_GAMMA:-0.25}" != 0.25 ]; then tag=$tag-g$SHRINK_GAMMA gamma=", \"gamma\": $SHRINK_GAMMA"; fi
  local K=benchmarks/results/shrinkage/$m-f$f$tag
  for seed in ${SHRINK_SEEDS:-${all[@]}}; do
    [ ! -f $K/seeds/s$seed/results.json ] || continue
    local R=runs/shrink-$m-f$f$tag-s$seed
    $OPENSTAMP eval "${SWEEP[@]}" --methods $m --set "grids={\"$m\": [$grid]}" \
      --set "method_settings={\"$m\": {\"shrinkage\": $f, \"centre\": $centre$gamma}}" --seeds $seed \
      --store $R-store --out $R
    mkdir -p $K/seeds/s$seed
    cp $R/results.json $R/report.md $K/seeds/s$seed/
  done
  merge_kept $K/seeds runs/shrink-$m-f$f$tag-merged $K "${all[@]}"
}

keep_eval() {
  # an at-cost stage keeps the eval it attacked (runs/sweep-s$1) in benchmarks/results/sweep/rerun/s$1, one folder the
  # at-cost stages share, where each result can be paired with it by its created time: trained keys and sampled
  # text depend on the CPU, so a seed run again on another machine is not the sweep's kept one. An eval of the seed kept
  # there before (another run of it, which earlier results attacked) stays: this one goes beside it, in s$1-2, s$1-3...
  # This eval goes in the folder that already holds it, wherever that is, or else in the first free one, so a removed
  # s$1-2 is not refilled with a copy of the eval kept in s$1-3
  local made dir=benchmarks/results/sweep/rerun/s$1 i=1 kept
  made=$($PY -c "import json; print(json.load(open('runs/sweep-s$1/results.json'))['created'])")
  kept=$(grep -l "\"created\": \"$made\"" benchmarks/results/sweep/rerun/s$1/results.json \
    benchmarks/results/sweep/rerun/s$1-*/results.json 2>/dev/null | head -1)
  if [ -n "$kept" ]; then dir=$(dirname $kept); fi
  while [ -z "$kept" ] && [ -f $dir/results.json ]; do
    i=$((i + 1))
    dir=benchmarks/results/sweep/rerun/s$1-$i
  done
  mkdir -p $dir
  cp runs/sweep-s$1/results.json $dir/
}

paraphrase_cost() {
  # paraphrase64's comparison at equal cost to the model, not at each method's default strength: on the sweep's eval
  # of seed PARA_COST_SEED (default 0; run `sweep` first; 64 new tokens, 4 strengths per method), each method at the
  # strength whose own perplexity change is nearest PARA_COST (default 0.3: +30%), the first 64 completions
  # paraphrased with each prompt of PARA_COST_PROMPTS (default: the paper's) and judged as in paraphrase_timed. About
  # 5 min per generation set and prompt on 2 cores (64-token texts)
  local seed=${PARA_COST_SEED:-0} K=benchmarks/results/paraphrase64/cost cost=${PARA_COST:-0.3}
  local S=runs/sweep-s$seed
  [ -f $S/results.json ] || { echo "no $S/results.json: run the sweep stage first"; return 1; }
  bash scripts/install_assets.sh qwen05
  mkdir -p $K
  for prompt in ${PARA_COST_PROMPTS:-paper}; do
    local name=para64-cost$cost-$prompt
    [ $seed = 0 ] || name=$name-s$seed  # seed 0 keeps the name its first results have
    $OPENSTAMP attack paraphrase --eval $S --paraphraser qwen2.5-coder-0.5b --prompt $prompt --n 64 \
      --at-cost $cost --out runs/$name
    cp runs/$name/results.json $K/$name.json
    cp $S/attacks/$name* $K/
  done
  keep_eval $seed  # the paper prompt's first keys attacked the sweep's kept seeds, which it reads too
}

robust_cost() {
  # token edits and quantization at equal cost to the model, where the default comparison's robustness table is
  # saturated: on the sweep's eval of seed ROBUST_COST_SEED (default 0; run `sweep` first; 200 prompts, 64 new
  # tokens), each method at the strength whose own perplexity change is nearest ROBUST_COST (default 0.3: +30%).
  # Every completion edited (10% and then 25% of the tokens deleted, and as many substituted), and the first 64 prompts
  # completed by each weight-level release quantized to NF4 and GGUF-Q4_K_M (lm_head as each recipe does), each
  # scored by the method's unchanged detector. About 8 min a key on 2 cores (AMD EPYC). Kept at +30% and, nearer
  # the +10% an owner aims at, ROBUST_COST=0.12 (each on keys 0-2); docs/results.md shows +12%
  local seed=${ROBUST_COST_SEED:-0} cost=${ROBUST_COST:-0.3} K=benchmarks/results/robust_cost
  local S=runs/sweep-s$seed suffix=""
  [ -f $S/results.json ] || { echo "no $S/results.json: run the sweep stage first"; return 1; }
  [ $seed = 0 ] || suffix=-s$seed
  mkdir -p $K
  for rate in 0.1 0.25; do
    local name=edit$rate-cost$cost$suffix
    $OPENSTAMP attack edit --eval $S --delete $rate --substitute $rate --at-cost $cost --out runs/$name
    cp runs/$name/results.json $K/$name.json
  done
  local name=quant-cost$cost$suffix
  $OPENSTAMP attack quantize --eval $S --scheme nf4,gguf-q4_k_m --head recipe --n 64 --at-cost $cost \
    --methods openstamp,openstamp-nosem,unremovable,gaussmark --out runs/$name
  cp runs/$name/results.json $K/$name.json
  keep_eval $seed  # the first keys attacked the sweep's kept seeds, which render.py reads too
}

durability_cost() {
  # merging, pruning and fine-tuning at equal cost to the model, where the durability runs compare each method at its
  # default strength (OpenStamp's default costs 2-5x the baselines'): on the sweep's eval of seed DURABILITY_COST_SEED
  # (default 0; run `sweep_eval` with that seed first), each weight-level method at the strength whose own perplexity
  # change is nearest DURABILITY_COST (default 0.3: +30%), and the first 64 prompts completed anew by each attacked
  # release. The attacks
  # (DURABILITY_COST_ATTACKS, default all three): merge, linear with the base (t 0.3, 0.5, 0.7: the base's weight);
  # prune, Wanda on 30% and 50% of every linear layer of the blocks; finetune, LoRA on wikipedia for 100 steps (the
  # fade stage's attack, shorter). Results go beside robust_cost's, beside them. About 15 min for merging
  # and pruning on 2 cores per key, and 26-31 min for the fine-tune (seeds 2 and 0)
  local seed=${DURABILITY_COST_SEED:-0} cost=${DURABILITY_COST:-0.3} K=benchmarks/results/robust_cost
  local S=runs/sweep-s$seed suffix="" methods=openstamp,openstamp-nosem,unremovable,gaussmark
  [ -f $S/results.json ] || { echo "no $S/results.json: run the sweep stage first"; return 1; }
  [ $seed = 0 ] || suffix=-s$seed
  mkdir -p $K
  for attack in ${DURABILITY_COST_ATTACKS:-merge prune finetune}; do
    local name=$attack-cost$cost$suffix settings
    case $attack in
      merge) settings=(--method linear --t 0.3,0.5,0.7) ;;
      prune) settings=(--method wanda --sparsity 0.3,0.5) ;;
      finetune) settings=(--corpus wikipedia --steps 100 --every 50) ;;
      *) echo "unknown attack $attack: merge, prune or finetune"; return 1 ;;
    esac
    $OPENSTAMP attack $attack --eval $S "${settings[@]}" --n 64 --at-cost $cost --methods $methods --out runs/$name
    cp runs/$name/results.json $K/$name.json
  done
  keep_eval $seed
}

default_attacks() {
  # the default key of 0.2.0 (the frontier stage's centred shrinkage run: openstamp-nosem, shrinkage 4, centred)
  # under the attacks paraphrase_cost, robust_cost and durability_cost apply to the sweep's methods, on its eval of each
  # seed of DEFAULT_SEEDS (default 0 1 2), at the strength nearest DEFAULT_COST (default 0.12: +12%), into
  # paraphrase64/cost/default/ and robust_cost/default/. DEFAULT_ATTACKS (default all) chooses among paraphrase (the
  # paper's prompt and the strong one), edit, quantize (NF4, GGUF-Q4_K_M), merge (linear with the base, t 0.5) and
  # finetune (LoRA, 100 steps). About 25 min a seed on 2 cores
  local cost=${DEFAULT_COST:-0.12} P=benchmarks/results/paraphrase64/cost/default K=benchmarks/results/robust_cost/default
  mkdir -p $P $K
  for seed in ${DEFAULT_SEEDS:-0 1 2}; do
    local S=runs/shrink-openstamp-nosem-f4-centred-s$seed tag=cost$cost-s$seed
    [ -f $S/results.json ] || { echo "no $S/results.json: run the frontier stage first"; return 1; }
    for attack in ${DEFAULT_ATTACKS:-paraphrase edit quantize merge finetune}; do
      local R=runs/default-$attack-$tag
      case $attack in
        paraphrase)
          bash scripts/install_assets.sh qwen05
          for prompt in paper strong; do
            [ -f $P/para64-$tag-$prompt.json ] && continue
            $OPENSTAMP attack paraphrase --eval $S --paraphraser qwen2.5-coder-0.5b --prompt $prompt --n 64 \
              --at-cost $cost --out $R-$prompt
            cp $R-$prompt/results.json $P/para64-$tag-$prompt.json
          done
          continue ;;
        edit) $OPENSTAMP attack edit --eval $S --delete 0.1 --substitute 0.1 --at-cost $cost --out $R ;;
        quantize) $OPENSTAMP attack quantize --eval $S --scheme nf4,gguf-q4_k_m --head recipe --n 64 --at-cost $cost \
          --out $R ;;
        merge) $OPENSTAMP attack merge --eval $S --method linear --t 0.5 --n 64 --at-cost $cost --out $R ;;
        finetune) $OPENSTAMP attack finetune --eval $S --corpus wikipedia --steps 100 --every 50 --n 64 \
          --at-cost $cost --out $R ;;
        *) echo "unknown attack $attack: paraphrase, edit, quantize, merge or finetune"; return 1 ;;
      esac
      cp $R/results.json $K/$attack-$tag.json
    done
  done
}

projection_pooled() {
  # the projection's effect under paraphrase, at equal cost: OpenStamp and the no-projection ablation, both with
  # selector shrinkage 4 at delta 0.5, the point where their costs meet in the shrinkage stage (+24.9% and +22.4% own
  # PPL; clean TPR@1%FPR 0.943 and 0.977), on the sweep's 64-token completions of its prompts, 3 seeds. The first
  # PROJECTION_N (default 100) completions of each seed are paraphrased by the 0.5B paraphraser with each prompt of
  # PROJECTION_PROMPTS (default: the paper's, then the strong one) and the near-copies excluded, so neither method
  # is credited for text the paraphraser left alone. About 25 min for the eval and 45 min per prompt on 2 cores
  local P=runs/eval-projection K=benchmarks/results/projection n=${PROJECTION_N:-100}
  local both='{"shrinkage": 4, "delta": 0.5}'
  bash scripts/install_assets.sh qwen05
  $OPENSTAMP eval --model smollm2-135m --methods openstamp,openstamp-nosem --seeds 0,1,2 --n 200 --new-tokens 64 \
    --oracle none --set lengths= --set "method_settings={\"openstamp\": $both, \"openstamp-nosem\": $both}" --out $P
  mkdir -p $K/attacks
  for prompt in ${PROJECTION_PROMPTS:-paper strong}; do
    $OPENSTAMP attack paraphrase --eval $P --paraphraser qwen2.5-coder-0.5b --prompt $prompt --n $n \
      --out runs/projection-para-$prompt
    cp runs/projection-para-$prompt/results.json $K/attacks/para-$prompt.json
    cp $P/attacks/projection-para-$prompt* $K/attacks/
  done
  cp $P/results.json $P/report.md $K/  # the report with every prompt's section
}

projection_keys() {
  # the projection stage's comparison on more keys, because its three keys differed more than its two methods did:
  # the same eval on seeds PROJECTION_SEEDS (default 3,4,5,6), whose first PROJECTION_KEYS_N (default 50) completions
  # are paraphrased with each prompt of PROJECTION_KEYS_PROMPTS (default: the paper's, then the strong one). The
  # the losses section pools both stages' keys. About 37 min for the eval and 35 min per prompt on 2 cores
  local P=runs/eval-projection-keys K=benchmarks/results/projection/keys n=${PROJECTION_KEYS_N:-50}
  local both='{"shrinkage": 4, "delta": 0.5}'
  bash scripts/install_assets.sh qwen05
  $OPENSTAMP eval --model smollm2-135m --methods openstamp,openstamp-nosem --seeds ${PROJECTION_SEEDS:-3,4,5,6} \
    --n 200 --new-tokens 64 --oracle none --set lengths= \
    --set "method_settings={\"openstamp\": $both, \"openstamp-nosem\": $both}" --out $P
  mkdir -p $K
  for prompt in ${PROJECTION_KEYS_PROMPTS:-paper strong}; do
    $OPENSTAMP attack paraphrase --eval $P --paraphraser qwen2.5-coder-0.5b --prompt $prompt --n $n \
      --out runs/projection-keys-para-$prompt
    cp runs/projection-keys-para-$prompt/results.json $K/para-$prompt.json
  done
  cp $P/results.json $P/report.md $K/  # the report with every prompt's section
}

durability_default() {
  # the durability attacks on the current releases (re-tied OpenStamp, exact m): their own small eval (32 prompts,
  # 100 new tokens, no oracle), then every attack family of the durability benchmark at n 32
  local D=runs/eval-durability R=runs/durability
  $OPENSTAMP eval --model smollm2-135m --methods openstamp,unremovable --n 32 --new-tokens 100 --oracle none --out $D
  $OPENSTAMP attack edit --eval $D --delete 0.1 --substitute 0.1 --out $R/edit
  # merging with the base, and with a fine-tune of the base (full instruction tuning, 100 steps)
  $OPENSTAMP attack merge --eval $D --method linear,slerp --t 0.1,0.3,0.5,0.7 --n 32 --out $R/merge-base
  [ -f runs/base-ft/config.json ] || $PY benchmarks/quality/base_finetune.py --out runs/base-ft
  $OPENSTAMP attack merge --eval $D --with runs/base-ft --method linear,slerp,ties,dare_ties --t 0.1,0.3,0.5,0.7 \
    --task-t 0.5 --density 0.5 --n 32 --out $R/merge-ft
  # pruning every linear layer of the blocks, then lm_head too (untied first)
  for m in magnitude wanda; do
    $OPENSTAMP attack prune --eval $D --method $m --sparsity 0.1,0.3,0.5 --n 32 --out $R/prune-$m
    $OPENSTAMP attack prune --eval $D --method $m --sparsity 0.1,0.3,0.5 --include-head --n 32 --out $R/prune-$m-head
  done
  for m in lora full; do
    $OPENSTAMP attack instruct --eval $D --mode $m --steps 100 --every 50 --n 32 --out $R/instruct-$m
  done
  # real quantizers, each with lm_head quantized and kept in float
  $OPENSTAMP attack quantize --eval $D --scheme gguf-q8_0,gguf-q4_k_m,int8,nf4,hqq-4bit --head both --out $R/quant
  # the head re-trained on every window of all packaged text (about one epoch in 500 steps)
  [ -f runs/demo/model/config.json ] || $OPENSTAMP demo --quiet
  $OPENSTAMP attack reinit-head --model runs/demo/model --steps 500 --every 100 --out $R/reinit
  mkdir -p benchmarks/results/durability/attacks
  cp $D/results.json $D/report.md benchmarks/results/durability/
  for dir in $R/*/; do
    a=$(basename $dir)
    if [ -f $R/$a/results.json ]; then cp $R/$a/results.json benchmarks/results/durability/attacks/$a.json; fi
    for png in $R/$a/*.png; do if [ -f "$png" ]; then cp "$png" benchmarks/results/durability/attacks/$a-$(basename $png); fi; done
  done
}

# -- the stages, one per section of docs/results.md

frontier() {
  # the Pareto sweep (7 methods x 4 strengths x 3 seeds), OpenStamp and its no-projection ablation with selector
  # shrinkage SHRINK_F (default 4) on the same prompts and seeds, the default key of 0.2.0 (no projection, shrinkage 4,
  # centred) likewise, then each point against the second-order ceiling
  sweep
  for m in openstamp openstamp-nosem; do SHRINK_METHOD=$m shrinkage; done
  SHRINK_METHOD=openstamp-nosem SHRINK_CENTRE=1 shrinkage
  # and with gamma 0.1, which flagged more texts at equal cost on the tune split (key_variants_sharper*.json)
  SHRINK_METHOD=openstamp-nosem SHRINK_CENTRE=1 SHRINK_GAMMA=0.1 SHRINK_GRID="0.4, 0.55, 0.7, 0.85" shrinkage
  $PY benchmarks/frontier/detection_budget.py
  # the key variants against 0.1.0's default key (the projected profile) on the tune split (one secret, one set of
  # states, the first 64 held-out prompts): the causes, then shrinkage (with skipped first tokens), a sharper bias and
  # the two penalties
  local V="$PY benchmarks/frontier/key_variants.py --profile projected"
  $V --variants plain,centred,consistency,raw,raw-centred
  $V --variants raw-centred-consistency --out benchmarks/results/key_variants_combined.json
  $V --variants raw-centred-f4,raw-centred-f8,raw-centred-f16,raw-centred-f32 --deltas 0.25,0.35 --skips 4,8,16 \
    --out benchmarks/results/key_variants_shrinkage.json
  $V --variants raw-centred-f4-g0.1,raw-centred-f4-L32 --deltas 0.35,0.5 --out benchmarks/results/key_variants_sharper.json
  $V --variants raw-centred-f4-g0.1 --deltas 0.6,0.7 --out benchmarks/results/key_variants_sharper_more.json
  $V --variants raw-centred-f4-c0.1,raw-centred-f4-c0.3,raw-centred-f4-F1,raw-centred-f4-F10 --deltas 0.35 \
    --out benchmarks/results/key_variants_penalties.json
  # the default key on every position of the held-in windows (390,480 states, in shards), and 0.1.0's default key
  # with its re-tied backbone repaired for 15 minutes (openstamp.embed.repair) before sampling
  $PY benchmarks/frontier/key_variants.py --profile default --variants centred-P240-N400000 --deltas 0.25,0.35 \
    --out benchmarks/results/key_variants_states.json
  # and on 500,000 states: those, plus 460 windows of the model's own samples (states.generated_windows)
  $PY benchmarks/frontier/key_variants.py --profile default --variants centred-P240-N500000-G460 --deltas 0.25,0.35 \
    --out benchmarks/results/key_variants_sampled.json
  $V --variants plain-R15 --deltas 0.5 --out benchmarks/results/key_variants_repair.json
  # the chosen default against 0.1.0's on 5 fresh keys and the next 64 prompts (the test split)
  $V --variants plain,raw-centred-f4 --deltas 0.35,0.5 --split test --keys 5 --first-key 1 \
    --out benchmarks/results/key_variants_fresh_keys.json
  $PY benchmarks/frontier/frontier_plot.py
}
# the default key's settings in the second model's stages (both name their OpenStamp methods by them in the tables)
QWEN_KEY='{"shrinkage": 4, "centre": true}'
qwen_frontier() {
  # the frontier on the second model, Qwen2.5-Coder-0.5B (tied, 151,936 tokens): the default key (openstamp-nosem,
  # shrinkage 4, centred), the same key with the projection, KGW+LLR and Unremovable, 3 strengths each, n 100, 200 new
  # tokens with the length curve at 64, each seed a shard from an empty store as in sweep(), kept under
  # benchmarks/results/qwen05/frontier/seeds/ and merged once seeds 0 and 1 are kept; then Unremovable rescored with
  # the LLR (openstamp analyze llr). QWEN_SEEDS="1" runs one seed; an interrupted seed resumes from its store.
  # Seed 0 took 69 min (plus about 24 for the LLR) on 2 Xeon cores, where the eval's 'fast' dtypes resolved to
  # bfloat16 (seed 1 there: 135 min, with tests run beside it); on 2 AMD EPYC cores with AVX2 only they resolve to float32 (bfloat16 matmuls run 100x slower there)
  # and sampling and own perplexity ran 6-7x slower. Seeds may run on either: the merge names each seed's dtypes
  # (merge-runs --mixed-dtypes), each run's cost being paired with its own seed's original model
  local K=benchmarks/results/qwen05/frontier all=(0 1)
  local both=$QWEN_KEY
  bash scripts/install_assets.sh qwen05
  for seed in ${QWEN_SEEDS:-${all[@]}}; do
    local R=runs/qwen-frontier-s$seed
    if [ ! -f $K/seeds/s$seed/results.json ]; then
      $OPENSTAMP eval --model qwen2.5-coder-0.5b --methods openstamp-nosem,openstamp,kgw-llr,unremovable --sweep \
        --set 'grids={"openstamp-nosem": [0.125, 0.25, 0.375], "openstamp": [0.125, 0.25, 0.375],
          "kgw-llr": [0.5, 1.0, 1.5], "unremovable": [0.2, 0.4, 0.6]}' \
        --set "method_settings={\"openstamp\": $both, \"openstamp-nosem\": $both}" --n 100 --new-tokens 200 \
        --set lengths=64 --seeds $seed --store $R-store --out $R
      mkdir -p $K/seeds/s$seed
      cp $R/results.json $R/report.md $K/seeds/s$seed/
    fi
    [ -f $K/seeds/s$seed/llr.json ] && continue
    $OPENSTAMP analyze llr --eval $R --out $R-llr
    cp $R-llr/results.json $K/seeds/s$seed/llr.json
  done
  MERGE_OPTIONS=--mixed-dtypes merge_kept $K/seeds runs/qwen-frontier-merged $K "${all[@]}"
  qwen_paraphrase
}
qwen_paraphrase() {
  # paraphrase on the second model, as the paraphrase stage on the first (64 new tokens, 64 completions a key, the
  # 0.5B paraphraser with the paper's prompt and the strong one): the default key, the same key with P, KGW+LLR and
  # Unremovable, each at the strength of the qwen_frontier grid nearest +7% own PPL there (+7.7%, +10.2%, +7.8%,
  # +5.9%), keys of seeds 0 and 1. The paraphraser is this model's own unwatermarked instruct weights (on the first
  # model it is another model). About 34 min for the eval and 39 min per prompt on 2 AMD EPYC cores
  local R=runs/qwen-para K=benchmarks/results/qwen05/paraphrase both=$QWEN_KEY
  bash scripts/install_assets.sh qwen05
  $OPENSTAMP eval --model qwen2.5-coder-0.5b --methods openstamp-nosem,openstamp,kgw-llr,unremovable --seeds 0,1 \
    --n 64 --new-tokens 64 --oracle none --set lengths= \
    --set 'strengths={"openstamp-nosem": 0.375, "openstamp": 0.375, "kgw-llr": 1.0, "unremovable": 0.4}' \
    --set "method_settings={\"openstamp\": $both, \"openstamp-nosem\": $both}" --out $R
  mkdir -p $K
  for prompt in ${QWEN_PARA_PROMPTS:-paper strong}; do
    [ -f $K/para-$prompt.json ] && continue
    $OPENSTAMP attack paraphrase --eval $R --paraphraser qwen2.5-coder-0.5b --prompt $prompt --n 64 \
      --out runs/qwen-para-$prompt
    cp runs/qwen-para-$prompt/results.json $K/para-$prompt.json
  done
}
lengths() {
  # the default comparison (every method at its default strength, 200 prompts, 200 new tokens, a length curve at 16,
  # 32, 64 and 128 tokens) from a cold start, timed (the speed section reads its timings), then what each method's
  # full-length threshold passes of human text cut shorter. TIMED_AGAIN=1 runs it again into eval_timed/rerun/
  # (a new run folder and store) to time later code
  if [ "${TIMED_AGAIN:-0}" = 1 ]; then timed_again; return; fi
  cold_eval runs/eval-timed benchmarks/results/eval_timed
  $PY benchmarks/fpr/threshold_lengths.py --eval runs/eval-timed
}
fpr() {
  # 20 keys' false-positive rates on 1000 texts per source of unwatermarked text (texts, keys and scores in runs/fpr),
  # then the reported tail p-value against 10^5 permutations on that release
  $PY benchmarks/fpr/fpr_per_key.py --out runs/fpr --profile projected
  $PY benchmarks/fpr/tail_check.py --model runs/fpr/model --key runs/fpr/key
  # the default key of 0.2.0: 10 keys on 1000 human texts and 1000 of the original model's pure samples, and its tail
  # check (against permutations and fresh keys)
  $PY benchmarks/fpr/fpr_per_key.py --out runs/fpr-default --keys 10 --sources human,base_pure --name fpr_per_key_default
  $PY benchmarks/fpr/tail_check.py --model runs/fpr-default/model --key runs/fpr-default/key \
    --prompts runs/fpr-default/texts/prompts.json --name tail_check_default
  # the second model: 5 keys of the default profile on Qwen2.5-Coder-0.5B, its own pure samples and human text
  bash scripts/install_assets.sh qwen05
  $PY benchmarks/fpr/fpr_per_key.py --model qwen2.5-coder-0.5b --out runs/fpr-qwen05 --keys 5 --n 500 \
    --sources base_pure,human --name fpr_per_key_qwen05
  # the product's path: 10 default keys, each with its own re-tied release, scored as openstamp detect scores (with
  # and without --base); then news and Wikipedia alone, Qwen's release path, and per-key calibration on a domain
  local pp="--keys 10 --n 1000 --new-tokens 64 --gen-dtype float32"
  $PY benchmarks/fpr/product_path_fpr.py $pp --sources human,base_pure,base_t0.7_p0.9,gemma3_pure,human_code \
    --out runs/fpr_product --name fpr_product_path_1000
  $PY benchmarks/fpr/product_path_fpr.py $pp --sources human_news,human_wikipedia --paths release \
    --out runs/fpr_product --name fpr_product_path_corpora
  $PY benchmarks/fpr/product_path_fpr.py $pp --model qwen2.5-coder-0.5b --n 300 --sources human \
    --out runs/fpr_product_qwen --name fpr_product_path_qwen05
  $PY benchmarks/fpr/product_path_fpr.py $pp --model qwen2.5-coder-0.5b --sources human,base_pure,human_code,human_news --paths release \
    --out runs/fpr_product_qwen1000 --name fpr_product_path_qwen05_1000
  $PY benchmarks/fpr/product_path_fpr.py $pp --model qwen2.5-coder-0.5b --sources human_wikipedia --paths release \
    --out runs/fpr_product_qwen1000 --name fpr_product_path_qwen05_corpora
  $PY benchmarks/fpr/product_path_fpr.py $pp --model qwen2.5-coder-0.5b --sources base_t0.7_p0.9 --paths release \
    --out runs/fpr_product_qwen1000 --name fpr_product_path_qwen05_tempered
  $PY benchmarks/fpr/product_path_fpr.py $pp --model qwen2.5-coder-0.5b --sources gemma3_pure --paths release \
    --out runs/fpr_product_qwen1000 --name fpr_product_path_qwen05_gemma
  $PY benchmarks/fpr/calibrated_fpr.py --keys 10 --n 1500
  # the family-wise FPR of 5 keys (Holm) on 1000 human windows, and detection of chat-formatted assistant turns
  $PY benchmarks/fpr/multikey_fpr.py --n 1000 --keys 5 --length 64 --profile small --out runs/multikey
  $PY benchmarks/quality/chat_detect.py --n 64 --new-tokens 160 --out runs/chat_detect
  # per-length thresholds and measured FPRs of the demo release (its key.json keeps them; the report is the data)
  [ -f runs/demo/key/key.json ] || $OPENSTAMP demo
  $OPENSTAMP calibrate --model runs/demo/model --key runs/demo/key --n 500 --length 64 --lengths 32,64,128,200 \
    --fpr 0.01,0.05 --report benchmarks/results/calibration_lengths --quiet
}
paraphrase() {
  # every method after paraphrase at equal cost: on the sweep's eval of each seed of PARA_COST_SEEDS (default 0 1 2;
  # a missing one is run again: sweep_eval), at each cost of PARA_COSTS (default 0.12 0.3), with each prompt of
  # PARA_COST_PROMPTS (default: paper strong)
  for seed in ${PARA_COST_SEEDS:-0 1 2}; do
    [ -f runs/sweep-s$seed/results.json ] || SWEEP_EVAL_SEED=$seed sweep_eval
    for cost in ${PARA_COSTS:-0.12 0.3}; do
      PARA_COST_SEED=$seed PARA_COST=$cost PARA_COST_PROMPTS=${PARA_COST_PROMPTS:-paper strong} paraphrase_cost
    done
  done
  DEFAULT_ATTACKS=paraphrase default_attacks  # the default key of 0.2.0 at +12%
}
durability_equal() {
  # the durability table at equal cost on the shipping default (issue 81): per seed of EQUAL_SEEDS (default 0 1 2) an
  # eval of the default key, Unremovable and KGW-distilled on grids around +12% own PPL (200 prompts, 64 new tokens, no
  # oracle; KGW-distilled's paper grid stops at delta 2, +6%, so its grid goes past it), then every attack at the
  # strength nearest EQUAL_COST (default 0.12): 10% and 25% token edits, NF4 and GGUF-Q4_K_M, linear merges with the
  # base at t 0.3, 0.5 and 0.7, Wanda at 50%, and 100 LoRA steps. Each result is kept in robust_cost/equal/ as it
  # lands and skipped once kept, so the stage resumes across sessions. About 2 h a seed on 2 cores (estimate)
  local cost=${EQUAL_COST:-0.12} K=benchmarks/results/robust_cost/equal methods=openstamp,unremovable,kgw-distilled
  local grids='grids={"openstamp": [0.354, 0.386, 0.42], "unremovable": [0.5, 0.6], "kgw-distilled": [2.5, 3.0]}'
  mkdir -p $K
  for seed in ${EQUAL_SEEDS:-0 1 2}; do
    local S=runs/equal-s$seed tag=cost$cost-s$seed
    $OPENSTAMP eval --model smollm2-135m --methods $methods --sweep --set "$grids" --seeds $seed --n 200 \
      --new-tokens 64 --oracle none --set lengths= --out $S
    mkdir -p $K/eval && cp $S/results.json $K/eval/s$seed.json
    for attack in edit0.1 edit0.25 quantize merge prune finetune; do
      local R=runs/equal-$attack-$tag settings
      [ -f $K/$attack-$tag.json ] && continue
      case $attack in
        edit0.1 | edit0.25) settings=(edit --delete ${attack#edit} --substitute ${attack#edit}) ;;
        quantize) settings=(quantize --scheme nf4,gguf-q4_k_m --head recipe --n 64) ;;
        merge) settings=(merge --method linear --t 0.3,0.5,0.7 --n 64) ;;
        prune) settings=(prune --method wanda --sparsity 0.5 --n 64) ;;
        finetune) settings=(finetune --corpus wikipedia --steps 100 --every 50 --n 64) ;;
      esac
      $OPENSTAMP attack "${settings[@]}" --eval $S --at-cost $cost --methods $methods --out $R
      cp $R/results.json $K/$attack-$tag.json
    done
  done
}
durability() {
  # every attack on the current releases at their default strengths, then token edits, quantization, merging,
  # pruning and fine-tuning at equal cost on the sweep's eval of each seed of ROBUST_SEEDS (default 0 1 2) at each
  # cost of ROBUST_COSTS (default 0.12 0.3)
  durability_default
  for seed in ${ROBUST_SEEDS:-0 1 2}; do
    [ -f runs/sweep-s$seed/results.json ] || SWEEP_EVAL_SEED=$seed sweep_eval
    for cost in ${ROBUST_COSTS:-0.12 0.3}; do
      ROBUST_COST_SEED=$seed ROBUST_COST=$cost robust_cost
      DURABILITY_COST_SEED=$seed DURABILITY_COST=$cost durability_cost
    done
  done
  DEFAULT_ATTACKS="edit quantize merge finetune" default_attacks  # the default key of 0.2.0 at +12%
  durability_equal  # the shipping default, Unremovable and KGW-distilled at +12% on 0.3.1
}
speed() {
  # detection, sampling and key-building speed, the HTTP service under load and against bad input, batch detection
  # on Ray, and the memory of building a key's selector; rebuilding a sweep key from its seed where the sweep left one
  $PY benchmarks/speed/detect_speed.py
  # a second model: the demo on Qwen2.5-Coder-0.5B, its detection speed, and each release's offset against its head
  bash scripts/install_assets.sh qwen05
  $OPENSTAMP demo --model qwen2.5-coder-0.5b --out runs/demo-qwen
  cp runs/demo-qwen/demo.json benchmarks/results/demo_qwen05.json
  $PY benchmarks/speed/detect_speed.py --model runs/demo-qwen/model --key runs/demo-qwen/key --batch 4 --length 128 \
    --memory-batch 8 --memory-length 128 --name detect_speed_qwen05
  $PY benchmarks/quality/offset_size.py --release runs/demo/model:runs/demo/key \
    --release runs/demo-qwen/model:runs/demo-qwen/key
  $PY benchmarks/speed/generate_speed.py --n 200 --new-tokens 64
  $PY benchmarks/speed/embed_stages.py --profile default
  $PY benchmarks/speed/ray_detect.py
  $PY benchmarks/speed/serve_load.py
  $PY benchmarks/speed/serve_bad_inputs.py
  $PY benchmarks/memory/key_memory.py
  $PY benchmarks/memory/kmeans_backends.py
  local K=runs/sweep-s0/keys/openstamp/s0
  if [ -d $K ]; then $PY benchmarks/memory/key_rebuild.py --key $K; fi
}
settings() {
  # the strength `openstamp tune` chooses (and with selector shrinkage SHRINK_F), what each strength costs in own
  # perplexity and lm-eval accuracy, and the paper's analyses: green lists against L, gamma and delta, prompt
  # independence, and the LLR detector on Unremovable and GaussMark
  tune_key runs/tune/key tune --profile projected
  local f=${SHRINK_F:-4}
  tune_key runs/tune-shrink$f/key tune_shrinkage --profile projected --set selector.shrinkage=$f
  # the default profile's delta: the smallest that flags 99% of 200-token texts at p <= 0.01 (64 prompts)
  tune_key runs/tune-default/key tune_default --target-tpr 0.99 --tokens 200 --n 64 --low 0.125
  local C=runs/eval-cost
  $OPENSTAMP eval --model smollm2-135m --methods openstamp --sweep --set 'grids={"openstamp": [0.25, 0.5, 0.75, 1.0]}' \
    --n 32 --new-tokens 64 --oracle none --set downstream=local --set downstream_limit=100 --set lengths=16,32 --out $C
  mkdir -p benchmarks/results/cost
  cp $C/results.json $C/report.md $C/*.png benchmarks/results/cost/
  local K=runs/tune/key D=runs/eval-durability B=runs/eval-baselines A=runs/analysis
  [ -f $D/results.json ] || $OPENSTAMP eval --model smollm2-135m --methods openstamp,unremovable --n 32 \
    --new-tokens 100 --oracle none --out $D
  [ -f $A/lists/results.json ] || $OPENSTAMP analyze lists --key $K --model smollm2-135m --out $A/lists
  [ -f $A/prompt/results.json ] || $OPENSTAMP analyze prompt --eval $D --out $A/prompt
  $OPENSTAMP eval --model smollm2-135m --methods unremovable,gaussmark --n 64 --new-tokens 64 --oracle none --out $B
  [ -f $A/llr/results.json ] || $OPENSTAMP analyze llr --eval $B --out $A/llr
  [ -f $A/gamma-delta/results.json ] || $OPENSTAMP analyze gamma-delta --key $K --model smollm2-135m \
    --gammas 0.1,0.25,0.5 --deltas 0.5,1,2 --tokens 64 --n 32 --out $A/gamma-delta
  for a in lists prompt llr gamma-delta; do
    mkdir -p benchmarks/results/analysis/$a
    cp $A/$a/results.json $A/$a/*.png benchmarks/results/analysis/$a/
  done
}
losses() {
  # the projection under paraphrase at equal cost (3 keys, then 4 more), a tied head re-tied against an untied export
  # (with the false-positive rate of the re-tied key on the fpr stage's texts), and the detectors' quality
  projection_pooled
  projection_keys
  $PY benchmarks/quality/retie.py
  $PY benchmarks/quality/detect_quality.py
}

main() {
  local stages=("$@")
  [ ${#stages[@]} -gt 0 ] || stages=(frontier lengths fpr paraphrase durability speed settings losses qwen_frontier)
  for stage in "${stages[@]}"; do
    case $stage in
      frontier | lengths | fpr | paraphrase | durability | speed | settings | losses | qwen_frontier) ;;
      qwen_paraphrase) ;;  # the end of qwen_frontier, alone
      durability_equal) ;;  # the end of durability, alone: the shipping default at equal cost (resumes)
      *) echo "unknown stage $stage: frontier lengths fpr paraphrase durability speed settings losses qwen_frontier" \
           "qwen_paraphrase durability_equal"
         exit 2 ;;
    esac
    echo "[reference] $stage: log in runs/logs/$stage.log"
    local start=$(date +%s)
    $stage > "runs/logs/$stage.log" 2>&1
    echo "[reference] $stage: $(( ($(date +%s) - start) / 60 )) min"
  done
}
# bash reads a script as it runs it, a line at a time: with main and exit on one line, parsed before main runs, this
# file can be edited while a stage runs without the run reading the edit (with exit on a line of its own, bash read on
# at the old offset of the edited file when main returned)
main "$@"; exit
