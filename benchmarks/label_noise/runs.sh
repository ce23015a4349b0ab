#!/usr/bin/env bash
# Every row of the label-noise benchmark's committed results files, in the order the rows were run (README.md
# says what each group measures). A run already in its results file is skipped, so running this script again only
# fills in what is missing; on 2 cores the whole of it takes days, one group at a time is the way to use it.
set -euo pipefail
cd "$(dirname "$0")/../.."
nice -n 5 python -m benchmarks.label_noise.label_noise --noise 0.4 --methods base heuristic prism ala
python -m benchmarks.label_noise.label_noise --table-only      # table.md from results.jsonl
# the 600-step protocol in its own file, clean base rows run there too:
R=benchmarks/label_noise/results_600.jsonl
R6=$R
O='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0}'
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 0.0 --bases contrastive margin --methods base heuristic
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases contrastive margin --methods ala --ala-options "$O"
python -m benchmarks.label_noise.label_noise --steps 600 --out $R --table-only   # results_600_table.md
# clean labels at the positive-pair settings, and weight_range chosen on the validation split (a list):
P='{"state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0}'
C='[{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0},
    {"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 2.0}]'
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.0 --bases margin triplet --methods ala --ala-options "$P"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases margin contrastive --methods ala --ala-options "$C"
# the warm start (the reality check's "pretrained" regime, 300 steps), its own file:
W=benchmarks/label_noise/results_pretrained.jsonl
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases contrastive --methods base ala
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases margin --methods base ala --ala-options "$P"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive --methods base heuristic ala --ala-options '{"trusted": [30, 3]}'
# the warm start under noise, DML-ALA alone or on the heuristic's pairs (chosen on the validation split):
A='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range'
H25="[$A\": 1.0}, $A\": 1.0, \"heuristic\": 0.25}]"
H50="[$A\": 1.0}, $A\": 1.0, \"heuristic\": 0.5}]"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases margin --methods base heuristic ala --ala-options "$H25"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases triplet --methods base heuristic ala --ala-options "$H50"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive --methods ala --ala-options '[{"trusted": [30, 3]}, {"trusted": [30, 3], "heuristic": 0.5}]'
python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --table-only  # results_pretrained_table.md
# 600 steps: all triplets alone or on the heuristic's pairs, the margin loss's further candidates, PRISM, 20 %:
M="[$A\": 1.0}, $A\": 2.0}, $A\": 1.0, \"heuristic\": 0.25}, $A\": 1.0, \"temperature\": 0.5}]"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases triplet --methods ala --ala-options "$H50"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases margin --methods ala --ala-options "$M"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --methods prism
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases margin triplet --methods base heuristic ala --ala-options "$O"
# the look-ahead on the embedder's head only (lookahead_variables="head"), the exact rows' options otherwise:
OH='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0, "lookahead_variables": "head"}'
PH='{"state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0, "lookahead_variables": "head"}'
HH='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0, "heuristic": 0.5, "lookahead_variables": "head"}'
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases contrastive margin --methods ala --ala-options "$OH"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive --methods ala --ala-options '{"trusted": [30, 3], "lookahead_variables": "head"}'
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive --methods ala --ala-options '{"trusted": [30, 3], "heuristic": 0.5, "lookahead_variables": "head"}'
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.0 --bases contrastive margin triplet --methods ala --ala-options "$PH"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases triplet --methods ala --ala-options "$HH"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases triplet --methods ala --ala-options "$OH"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases margin triplet --methods ala --ala-options "$OH"
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases contrastive --methods base heuristic
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases contrastive --methods ala --ala-options "$OH"
# from scratch at 20 %: all triplets alone or on the heuristic's pairs, head-only (chosen on the validation split);
# the look-ahead probe on the margin loss; then the margin loss with a contrastive validation loss (neg_margin from
# the probe's negative-pair distances), alone or on the heuristic's pairs, chosen on the validation split:
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases triplet --methods ala --ala-options "[$OH, $HH]"
nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime scratch --noise 0.2 --base margin --seed 0 --at 0 150 400
S="${OH%\}}, \"validation_loss\": \"contrastive\", \"validation_loss_params\": {\"pos_margin\": 0.0468, \"neg_margin"
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.2 --bases margin --methods ala --ala-options \
  "[$S\": 0.75}}, $S\": 0.9}}, $S\": 0.75}, \"heuristic\": 0.25}, $S\": 0.9}, \"heuristic\": 0.25}]"
# clean labels at the settings chosen at 20 %:
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.0 --bases margin --methods ala --ala-options "$S\": 0.9}}"
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.0 --bases triplet --methods ala --ala-options "$HH"
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.0 --bases triplet --methods heuristic
QH='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0, "heuristic": 0.25, "lookahead_variables": "head"}'
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases margin --methods ala --ala-options "$QH"
nice -n 5 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases triplet --methods ala --ala-options "$HH"
# the exact and the head-only step as candidates on the validation split:
nice -n 5 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases contrastive margin --methods ala --ala-options "[$A\": 1.0}, $A\": 1.0, \"lookahead_variables\": \"head\"}]"
# The rows with distance_prior (warm-started, a prior at the heuristic's ranking on the assessor's logits) were
# run with a DML-ALA switch that the library no longer has: they showed it of no use (README) and stay in the
# results; git keeps the switch and these cells.
# the per-pair meta-gradient, head-only against exact, along a warm-started head-only run (seed 0):
nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime pretrained --seed 0   # results_lookahead_signal.jsonl
# the same with a validation loss whose negative pairs are active (ALAModel's validation_loss), then the
# warm-start head-only row with it (neg_margin chosen on the validation split):
V='{"trusted": [30, 3], "lookahead_variables": "head", "validation_loss": "contrastive", "validation_loss_params": {"pos_margin": 0.0468, "neg_margin'
for M in 1.0 1.4; do nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime pretrained --seed 0 --options \
  "{\"trusted\": [30, 3], \"validation_loss\": \"contrastive\", \"validation_loss_params\": {\"pos_margin\": 0.0468, \"neg_margin\": $M}}"; done
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.0 --bases contrastive --methods ala --ala-options "[$V\": 1.4}}, $V\": 1.6}}]"
# that validation loss (it scores the virtual step; the base loss trains) for every base loss, alone or on the
# heuristic's pairs, chosen on the validation split, at 40 % and 20 %:
V1="$V\": 1.4}"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive triplet --methods ala --ala-options "[$V1}, $V1, \"heuristic\": 0.5}]"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases margin --methods ala --ala-options "[$V1}, $V1, \"heuristic\": 0.25}]"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.2 --bases contrastive triplet --methods base heuristic ala --ala-options "[$V1}, $V1, \"heuristic\": 0.5}]"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.2 --bases margin --methods base heuristic ala --ala-options "[$V1}, $V1, \"heuristic\": 0.25}]"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases margin --methods ala --ala-options "[$V1}, $V1, \"heuristic\": 0.25}]"
nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases triplet --methods ala --ala-options "$V1, \"heuristic\": 0.5}"
# output_penalty (a pull on the assessor's outputs): from scratch at 40 % on the head-only row (chosen on the
# validation split among 0.1 and 0.3), then warm-started on the setting chosen there at 40 % for the contrastive loss:
OP='{"trusted": [30, 3], "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0, "lookahead_variables": "head", "output_penalty'
nice -n 12 python -m benchmarks.label_noise.label_noise --steps 600 --out $R --noise 0.4 --bases contrastive --methods ala --ala-options "[$OP\": 0.1}, $OP\": 0.3}]"
nice -n 12 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 --bases contrastive --methods ala --ala-options "$V1, \"heuristic\": 0.5, \"output_penalty\": 0.1}"

# Fashion-MNIST, the contrastive loss (results_fashion.jsonl), and the references of its table:
F="python -m benchmarks.label_noise.label_noise --data fashion_mnist --bases contrastive"
nice -n 5 $F --noise 0.0 --methods base
nice -n 5 $F --noise 0.4 0.2 --methods base heuristic ala --ala-options '{"trusted": [5, 60]}'
nice -n 5 $F --noise 0.0 --methods ala --ala-options '{"trusted": [5, 60]}'
python -m benchmarks.label_noise.fashion            # the references
python -m benchmarks.label_noise.label_noise --data fashion_mnist --table-only   # results_fashion_table.md

# Every glyph cell again on one machine (the [B] rows): base loss, heuristic and four DML-ALA candidates per cell,
# chosen on the validation split; warm-started at 40 % and 20 % then clean, from scratch at 20 % then clean at the
# setting chosen at 20 %.
V='{"trusted": [30, 3], "lookahead_variables": "head", "validation_loss": "contrastive", "validation_loss_params": {"pos_margin": 0.0468, "neg_margin": 1.4}'
A='{"trusted": [30, 3], "lookahead_variables": "head"'
S9="$A, \"validation_loss\": \"contrastive\", \"validation_loss_params\": {\"pos_margin\": 0.0468, \"neg_margin\": 0.9}"
for base in margin triplet contrastive; do
  R=0.5; [ $base = margin ] && R=0.25
  C="[$V}, $V, \"heuristic\": $R}, $V, \"output_penalty\": 0.3}, $V, \"heuristic\": $R, \"output_penalty\": 0.3}]"
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.2 --bases $base --methods base heuristic ala --ala-options "$C"
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases $base --methods base ala --ala-options "$C"
  C="[$A}, $A, \"heuristic\": $R}, $S9}, $S9, \"heuristic\": $R}]"
  nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.2 --bases $base --methods base heuristic ala --ala-options "$C"
done
# clean labels from scratch at the setting chosen at 20 % (read off the validation table), e.g. the margin loss's:
nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.0 --bases margin --methods base ala --ala-options "$S9, \"heuristic\": 0.25}"
# Fashion-MNIST with the head-only settings (alone, on the heuristic's pairs, with the contrastive validation loss):
FA='{"trusted": [5, 60], "lookahead_variables": "head"'
FV="\"validation_loss\": \"contrastive\", \"validation_loss_params\": {\"pos_margin\": 0.0468, \"neg_margin\": 1.4}"
nice -n 10 $F --noise 0.4 --methods base heuristic ala --ala-options "[$FA}, $FA, \"heuristic\": 0.5}, $FA, \"heuristic\": 0.5, $FV}]"
nice -n 10 $F --noise 0.2 --methods base heuristic ala --ala-options "[$FA}, $FA, \"heuristic\": 0.25}, $FA, \"heuristic\": 0.25, $FV}]"
nice -n 10 $F --noise 0.0 --methods base ala --ala-options "$FA, \"heuristic\": 0.5, $FV}"
# The margin loss's candidates that the validation split did not choose, on the test seeds too:
for o in "$V}" "$V, \"heuristic\": 0.25}" "$V, \"output_penalty\": 0.3}" "$V, \"heuristic\": 0.25, \"output_penalty\": 0.3}"; do
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.2 --bases margin --methods ala --ala-options "$o"
done
for o in "$A}" "$A, \"heuristic\": 0.25}"; do
  nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.2 --bases margin --methods ala --ala-options "$o"
done
# DML-ALA at the library's defaults (the exact step) with the verified set, every glyph cell on one machine:
D='{"trusted": [30, 3]}'
for base in contrastive triplet margin; do
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.2 0.0 --bases $base --methods ala --ala-options "$D"
  nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.2 0.0 --bases $base --methods base ala --ala-options "$D"
done
nice -n 10 $F --noise 0.4 0.2 0.0 --methods ala --ala-options '{"trusted": [5, 60]}'   # Fashion-MNIST, the same
# The verified cut (distance_cut 1.0): DML-ALA on the pairs it keeps (validated) and the cut alone (uniform weights),
# warm-started at 40 %, 20 % and clean; from scratch at 20 %.
VC="$V, \"distance_cut\": 1.0}"
AC="$A, \"distance_cut\": 1.0}"
U='{"trusted": [30, 3], "weighting": "uniform", "distance_cut": 1.0}'
for base in contrastive triplet margin; do
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.2 --bases $base --methods ala --ala-options "[$VC]"
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.4 0.2 0.0 --bases $base --methods ala --ala-options "$U"
  nice -n 10 python -m benchmarks.label_noise.label_noise --regime pretrained --out $W --noise 0.0 --bases $base --methods ala --ala-options "$VC"
  nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.2 --bases $base --methods ala --ala-options "[$AC]"
done
# The cut from scratch on clean labels, and on Fashion-MNIST (alone or with the contrastive validation loss):
for base in triplet margin contrastive; do
  nice -n 10 python -m benchmarks.label_noise.label_noise --steps 600 --out $R6 --noise 0.0 --bases $base --methods ala --ala-options "$AC"
done
FC='{"trusted": [5, 60], "lookahead_variables": "head", "distance_cut": 1.0'
nice -n 10 $F --noise 0.4 0.2 --methods ala --ala-options "[$FC}, $FC, $FV}]"
nice -n 10 $F --noise 0.0 --methods ala --ala-options "$FC}"
nice -n 10 $F --noise 0.0 --methods ala --ala-options "$FC, $FV}"
