"""DML-ALA: deep metric learning via adaptive learnable assessment (Zheng et al., CVPR 2020, §3).

Each step takes one episode `(train_images, train_labels, val_images, val_labels)`: the training subset is the
batch the base loss trains on, the validation subset is drawn in addition with labels disjoint from it
(`tfdml.ala_options.episode_sizes`). The base loss (`TripletLoss`, `MarginLoss`, `ContrastiveLoss`) lists its
tuples and their unreduced terms (`loss.terms`); the assessor gives each tuple a weight and the weighted terms
go through the loss's own reduction, so that with every weight 1 the step is exactly the plain loss's step.
Algorithm 1, `L_va` the base loss on the validation subset unless `ALAModel(validation_loss=...)` gives another:

    theta'(phi) = theta - o - P (.) grad_theta L(w(phi); theta)                          (10)
    K times:  phi <- phi - b * grad_phi L_va(theta'(phi))                                (11, 12)
    theta <- optimizer step on grad_theta L(w(phi*); theta)                              (13)

`ALAModel(variant="default")` weighs the positive pairs from one shared LSTM state per step, with centred,
bounded softmax weights of mean 1; `variant="paper"` is Algorithm 1 literally (every tuple, sigmoid weights,
sums over tuples). `tfdml.ala_options.VARIANTS` lists what each variant sets; the DML-ALA guide says why, and
the label-noise benchmark what it measures. The meta-gradient is exact, without a Hessian (`episode.py`: one
Jacobian-vector product of the embedder), checked against finite differences in `tests/models/ala/test_ala.py`; the
look-ahead `theta'` is the paper's SGD step or the compiled optimizer's, moving every variable or, cheaper, the
embedder's head alone (`lookahead_variables="head"`: `lookahead.py`).

Under `MirroredStrategy` every replica gathers the whole episode and computes the single-device update. Logged
per step: `loss`, `meta_loss`, `weight_mean`, `weight_variance`, `output_std` and, for triplets, the hardness
(`tfdml.plots.plot_ala_weights` draws them).
"""

from tfdml.models.ala.model import ALAModel, ala_training, resolve_base_loss

__all__ = ["ALAModel", "ala_training", "resolve_base_loss"]
