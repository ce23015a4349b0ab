"""Which of tfdml's traced functions go through AutoGraph.

`tf.data` and `tf.function` convert a function's Python source with AutoGraph by default, so that `if`,
`for` and `while` on tensors become graph control flow. tfdml's dataset and serving functions branch only on
Python values (their tensor branches are explicit `tf.cond` and `tf.while_loop`), and AutoGraph leaves Keras
and TensorFlow functions as they are, so converting them would give the same graph at a cost that every
process tracing them pays (parsing and rewriting each function's source). `eval_dataset` and the exported
signatures are traced as written unless they call a function of the user's (a source's loader, a
preprocessing function, a model's `export_outputs`), which may branch on tensors in Python as `tf.data` and
`tf.function` allow: that one is converted as before. The training streams (`sampling`) are always traced as
written: they load their images in a dataset made inside another dataset's function, where a user's function
was not converted before either.
"""

import tensorflow as tf

# Modules whose functions AutoGraph need not convert: tfdml's own (see above); Keras and TensorFlow, which
# AutoGraph never converts.
_AS_WRITTEN = ("tfdml.", "keras.", "tensorflow.")


def autograph_needed(*functions):
    """Whether a tfdml function that calls `functions` (None: none) needs AutoGraph: when one of them is the
    user's own."""
    return any(f is not None and not (getattr(f, "__module__", None) or "").startswith(_AS_WRITTEN) for f in functions)


def dataset_function(function, *calls):
    """`function` for a `tf.data` transformation (`map`, `filter`, `interleave`, ...), traced without AutoGraph
    unless it `calls` a user's function (`autograph_needed`)."""
    return function if autograph_needed(*calls) else tf.autograph.experimental.do_not_convert(function)
