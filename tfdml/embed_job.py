"""What `tfdml embed` does, declared once without Beam, Ray or TensorFlow: `EmbedJob`'s fields are the job of
`tfdml.beam.run_embed` and `tfdml.ray.run_embed`, and the command's options are made from them
(`tfdml.cli.embed`), each with its flag, group and help beside its type and default; `RayCluster` is where and
how wide the Ray driver runs."""

import dataclasses
import os
import posixpath

from tfdml.retrieval_options import INDEX_MODES as _SCANN_MODES
from tfdml.retrieval_options import TARGET_RECALL

# How to install the beam extra, as the README writes it: in the top folder of tfdml's source (a clone or an
# unpacked source archive).
BEAM_INSTALL = 'pip install -e ".[beam]"'
RAY_INSTALL = 'pip install -e ".[ray]"'
ENGINES = ("beam", "ray")
FORMATS = ("tfrecord", "parquet")
INDEX_MODES = (*_SCANN_MODES, "none")
INPUTS = ("image_dir", "images", "tfrecords")
# Fields that take a positive integer.
COUNTS = ("num_shards", "batch_size", "num_neighbors")


def _option(default=None, *, help, group=None, flag=None, metavar=None, choices=None, required=False):
    """A field and its command-line option (`--name-with-dashes` unless `flag` says otherwise)."""
    cli = {"help": help, "group": group, "flag": flag, "metavar": metavar, "choices": choices, "required": required}
    return dataclasses.field(default=default, metadata={"cli": cli})


@dataclasses.dataclass(frozen=True)
class EmbedJob:
    """What `tfdml embed` does, checked once when made (`ValueError` naming the field); each field's help says
    what it is.

    Example:
        >>> EmbedJob(model="exported_models/cub", output="embeddings/cub", image_dir="cub/images").pattern
        'cub/images/*/*'
    """

    model: str = _option(
        metavar="DIR",
        required=True,
        help="exported model: <base_dir>/<name> (latest version) or a version directory (a URL such as "
        "gs://... must name the version directory).",
    )
    image_dir: str = _option(
        metavar="DIR",
        group="images (one of)",
        help="a folder tree DIR/<class>/<image>; the class is the sub-folder's name.",
    )
    images: str = _option(
        metavar="GLOB",
        group="images (one of)",
        help="image files matching a glob (quote it), e.g. 'photos/*/*.jpg'; an image's class is its parent "
        "folder's name.",
    )
    tfrecords: str = _option(
        metavar="GLOB",
        group="images (one of)",
        help="TFRecord files of tf.train.Examples with an 'image' bytes feature (the encoded image) and optional "
        "'id' and 'class' bytes features (without 'id', the image's SHA-1).",
    )
    output: str = _option(
        metavar="DIR", required=True, group="output", help="the output folder (local, or a URL such as gs://...)."
    )
    file_format: str = _option(
        "tfrecord",
        flag="--format",
        choices=FORMATS,
        group="output",
        help="embedding files: TFRecord of tf.train.Examples or Parquet, each row id, class, embedding.",
    )
    num_shards: int = _option(4, group="output", help="embedding files and indexes, one per shard.")
    overwrite: bool = _option(
        False,
        group="output",
        help="replace an existing output folder (a local one only once the new one is complete).",
    )
    batch_size: int = _option(64, group="embedding and index", help="the largest batch of images sent to the model.")
    index_mode: str = _option(
        "auto",
        choices=INDEX_MODES,
        group="embedding and index",
        help="ScaNN index of each shard: auto (brute force below 20,000 items, else approximate), exact, "
        "approximate, or none.",
    )
    target_recall: float = _option(
        TARGET_RECALL,
        group="embedding and index",
        help="recall@--num-neighbors against exact search that an approximate shard index must reach "
        "(measured on the shard, as tfdml export measures its index).",
    )
    num_neighbors: int = _option(10, group="embedding and index", help="the k of the recall target.")

    def __post_init__(self):
        given = [name for name in INPUTS if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(f"give exactly one input (image_dir, images or tfrecords), got {given or 'none'}.")
        if self.file_format not in FORMATS:
            raise ValueError(f"file_format must be one of {', '.join(FORMATS)}, got {self.file_format!r}.")
        if self.index_mode not in INDEX_MODES:
            raise ValueError(f"index_mode must be one of {', '.join(INDEX_MODES)}, got {self.index_mode!r}.")
        for name in COUNTS:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if not 0.0 < float(self.target_recall) <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1], got {self.target_recall}.")

    @property
    def pattern(self):
        """The file glob of the input: `image_dir/*/*` for a folder tree."""
        if self.image_dir:
            join = posixpath.join if "://" in self.image_dir else os.path.join  # as tfdml.catalogue.files.join
            return join(self.image_dir, "*", "*")
        return self.images or self.tfrecords


@dataclasses.dataclass(frozen=True)
class RayCluster:
    """Where and how wide `tfdml.ray` runs, checked once when made (`ValueError` naming the field).

    `cpus` is what each actor or task asks of Ray: a fraction, because on a node with one CPU a task that asks a
    whole CPU waits, with no error, behind the actors holding part of it.

    Example:
        >>> RayCluster(address="127.0.0.1:6379", actors=2).cpus
        0.5
    """

    address: str = None  # a running cluster's head ("HOST:PORT" or "auto"); None starts a local one-node Ray
    actors: int = 2  # model replicas embedding in parallel (each loads the SavedModel once)
    cpus: float = 0.5  # CPUs each actor and task asks of Ray

    def __post_init__(self):
        if self.address is not None and not str(self.address).strip():
            raise ValueError("address must name the cluster's head (HOST:PORT or auto), got an empty string.")
        if int(self.actors) < 1:
            raise ValueError(f"actors must be a positive integer, got {self.actors}.")
        if not 0.0 < float(self.cpus) <= 64:
            raise ValueError(f"cpus must be in (0, 64], got {self.cpus}.")

    @property
    def on_loopback(self):
        return on_loopback(self.address)


def on_loopback(address):
    """Whether a Ray address `HOST:PORT` is this machine's loopback interface (nodes started on one machine),
    where Ray needs `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` before it is imported."""
    host = str(address or "").rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")
