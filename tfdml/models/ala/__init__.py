"""DML-ALA: deep metric learning via adaptive learnable assessment (Zheng et al., CVPR 2020, §3).

Each training step takes one episode `(train_images, train_labels, val_images, val_labels)`: the training
subset is the batch the base loss trains on, the validation subset is drawn in addition with labels disjoint
from it (`tfdml.ala_options.episode_sizes`; `episode_dataset(disjoint_labels=False)` is Table 1's ablation).
The base loss is a tfdml loss as a user compiles it (`TripletLoss`, `MarginLoss`, `ContrastiveLoss`): it lists
its tuples and their unreduced terms (`loss.terms`, `tfdml.ops.TupleTerms`), the assessor gives each tuple a
weight, and the weighted terms go through the loss's own reduction (`tfdml.ops.reduce_terms`):

    L(w; theta) = sum_g sum_{i in g} w_i v_i(theta) / sum_{i in g} w_i d_i   (+ the loss's unweighted extra)

so that with every weight 1 the real step is exactly the loss's step (`tests/test_ala.py` compares it with
`model.fit` of the plain loss). Algorithm 1:

    theta'(phi) = theta - o - P (.) grad_theta L(w(phi); theta)                          (10)
    K times:  phi <- phi - b * grad_phi L_va(theta'(phi))                                (11, 12)
    theta <- optimizer step on grad_theta L(w(phi*); theta)                              (13)

with `L_va` the base loss on the validation subset. Two variants (`ALAModel(variant=...)`):

- `variant="default"`: the assessor weighs the positive pairs (`assessed="positive_pairs"`): a pair loss's
  positive pairs, the negative pairs keeping weight 1, or a triplet loss's anchor-positive pairs, one weight
  shared by the pair's triplets; all from one shared LSTM state per step (`state="per_step"`). The outputs are
  centred logits, `z_i` = the Dense head's output minus the mean over the step's assessed tuples; `w_i = n
  softmax(z / temperature)_i` over the `n` of them (mean 1), optionally `f + (1 - f) w_i` with `weight_floor=f`
  (default 0: a tuple the meta-gradient says hurts can be silenced), with the logits bounded, `r tanh(z / r)`,
  by `weight_range=r` (default 1: unbounded logits let one clean contrastive glyph run of five, and all-triplets
  training under label noise, collapse onto a few pairs). There is no idle degree of freedom: the outputs have
  no common shift (centred), the reduction ignores a common scale of the weights, and the logits are linear (no
  sigmoid to saturate). The assessor reads each tuple's geometry (`assessor_input="geometry"`), trained by
  Adam(1e-3); SGD look-ahead. Why these choices (`tfdml.ala_options.VARIANTS`, measured on glyphs in
  `benchmarks/label_noise`): with the contrastive loss, weighting every pair through the recurrence was 22 R@1
  points below the plain loss on clean data; the positive pairs from one state per step, bounded at 1, are
  within a point of the plain contrastive, margin and all-triplets losses clean or above them (600 steps) and
  above them under 40 % label noise with a verified validation set.
- `variant="paper"`: Algorithm 1 literally: every tuple weighted, `w_i = A_i = sigmoid(z_i)` read by the
  recurrence over tuples (eq 8), the sums of eqs 10-13 over tuples (`reduction="sum"`: no division, the
  paper's rates), the concatenated tuple embeddings as input, SGD(4e-4).

The assessor weights only the tuples whose weight can change the loss (`ALAModel.assessed_tuples`): a term
with value 0 and divisor 0 (an inactive hinge under a mean over the active terms) adds nothing to the sum or
to the count whatever its weight; the others keep weight 1.

The look-ahead `theta' = theta - o - P (.) g` (`lookahead.py`): "sgd" (the paper's) takes `P` = the learning
rate that trains each variable in (13); "optimizer" is the compiled optimizer's step with its state held
constant (SGD momentum / Nesterov, Adam / AdamW with `v_t` from this episode's uniform-weight gradient, weight
decay), equal to Keras' step at uniform weights. Loss variables (the margin loss's `beta`) are constants of the
virtual step and trained in (13) by the loss's own optimizer.

The meta-gradient is exact, without a Hessian (`episode.py`). With `u_i(w)` the reduction's coefficients
(`tfdml.ops.term_coefficients`, `grad_theta L(w) = sum_i u_i(w) grad_theta v_i`) and `g_va = grad L_va(theta')`:

    dL_va/dphi = -sum_i (du_i/dphi) c_i,   c_i = <grad_theta v_i, P g_va> = <dv_i/dE, J (P g_va)>

`J (P g_va)` is one Jacobian-vector product of the embedder (`tf.autodiff.ForwardAccumulator`), `dv_i/dE`
applied to it is the derivative of the recorded terms' vector-Jacobian product in its upstream (no term is
recomputed: a sampled loss would draw other tuples); then `phi` takes a gradient step on `-sum_i u_i(w(phi))
c_i` (constants `c_i`). `tests/test_ala.py` checks it against central finite differences in float64.

`meta_interval=N` runs the K assessor updates only every N-th step (between them the assessor weights the
tuples with its latest parameters).

Logged per step (Keras metrics): `loss` (the weighted training loss of (13)), `meta_loss` (the validation loss
at theta', on the steps that update the assessor), `weight_mean` / `weight_variance` (of the applied weights
of the assessed tuples), `output_std` (the spread of the assessor's centred outputs, softmax weights: a
drift towards saturation shows here), and for triplets the hardness `r_i = d(a,p) / d(a,n)`: `hardness` (mean),
`weighted_hardness` (mean of `w_i r_i`, the paper's AWH), `hardness_ratio`. `tfdml.plots.plot_ala_weights`
draws them; `ALAModel.tuple_weights` reads the weights of the tuples of any training subset.

Distribution: under `MirroredStrategy` each replica receives a share of the episode; ALA gathers the whole
episode on every replica, every replica computes the same update and the gradients are divided by the number
of replicas before the optimizers sum them: the single-device update on the same episode.
"""

from tfdml.models.ala.model import ALAModel, ala_training, resolve_base_loss

__all__ = ["ALAModel", "ala_training", "resolve_base_loss"]
