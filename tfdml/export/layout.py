"""Where things live in an exported version and how they are found: signature, input and output names,
the metadata file, the index folder, version resolution and the SavedModel fingerprint."""

import json
import os

import tensorflow as tf

from tfdml import durable

METADATA_FILE = "tfdml_metadata.json"
SERVING_SIGNATURE = "serving_default"
PREPROCESSED_SIGNATURE = "embed_preprocessed"
SEARCH_SIGNATURE = "search"
IMAGE_INPUT = "images"
PREPROCESSED_INPUT = "preprocessed"
EMBEDDING_OUTPUT = "embedding"
# Inside the version directory: TF Serving ignores `assets.extra/` (it only reads warm-up requests there).
INDEX_DIR = os.path.join("assets.extra", "tfdml_index")
# Gallery pixels kept with an index of in-memory images (no file paths to show), up to this size.
GALLERY_IMAGES_FILE = "gallery_images.npy"
MAX_STORED_GALLERY_BYTES = 64 * 2**20


def _fingerprint(version_dir):
    """The SavedModel's checksum (`fingerprint.pb`), which ties an index to the exact model it embeds."""
    try:
        # Graph, signatures, object graph and checkpoint hashes: other weights give another fingerprint.
        return tf.saved_model.experimental.read_fingerprint(os.fspath(version_dir)).singleprint()
    except Exception:  # older SavedModels have no fingerprint.pb
        return None


def _write_json(path, value):
    durable.write_json(path, value, indent=2)


def seal_version(version_dir, metadata):
    """Records the size and sha256 of every file of the version in its `metadata` (`files`), writes it, and
    flushes the whole version to the disk (`verify_version` checks the files against it on loading)."""
    metadata["files"] = durable.folder_records(version_dir, leave_out=(METADATA_FILE,))
    _write_json(os.path.join(version_dir, METADATA_FILE), metadata)
    durable.sync_tree(version_dir)


def verify_version(version_dir, metadata, index=True):
    """Raises `DamagedFileError` naming the first file of the version that differs from the size and checksum
    its metadata records (a version exported before the metadata recorded them is not checked); `index=False`
    leaves out the index folder (an index about to be replaced)."""
    records = metadata.get("files") or {}
    if not index:
        folder = INDEX_DIR.replace(os.sep, "/") + "/"
        records = {name: record for name, record in records.items() if not name.startswith(folder)}
    try:
        durable.check_files(version_dir, records)
    except durable.DamagedFileError as error:
        raise durable.DamagedFileError(
            f"{error}; the exported version {version_dir} is not loaded: export it again"
        ) from None


def resolve_export_dir(path, version=None):
    """The version directory for `path`: a version directory itself, or `<base>/<name>` (latest version,
    or `version`)."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        if version is not None and os.path.basename(os.path.normpath(path)) != str(version):
            raise ValueError(
                f"{path!r} is a version directory; --version {version} asks for another one "
                f"(pass <base>/<name> with --version, or the version directory alone)."
            )
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no exported model at {path!r} (not a directory).")
    versions = sorted(
        int(v) for v in os.listdir(path) if v.isdigit() and os.path.exists(os.path.join(path, v, "saved_model.pb"))
    )
    if version is not None:
        if int(version) not in versions:
            raise FileNotFoundError(
                f"no exported version {version} in {path!r} (versions: {', '.join(map(str, versions)) or 'none'})."
            )
        return os.path.join(path, str(int(version)))
    if not versions:
        raise FileNotFoundError(
            f"{path!r} holds no exported model (no saved_model.pb and no numeric version directory)."
        )
    return os.path.join(path, str(versions[-1]))


def load_metadata(path, version=None):
    """The metadata dict written beside an exported model."""
    with open(os.path.join(resolve_export_dir(path, version), METADATA_FILE)) as f:
        return json.load(f)
