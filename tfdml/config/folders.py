"""The checks of an image folder a configuration names (`data.path`, `data.eval_path`, `ala.val_path`): the
layout `DIR/<class name>/<image files>`, looked at cheaply before any work; `tfdml.data.image_folder` checks the
files themselves. No TensorFlow is imported here."""

import os

from tfdml.config.schema import ConfigError


def check_image_folder(folder, key):
    """A `ConfigError` naming `key` unless `folder` is a directory laid out as an image folder."""
    if not os.path.isdir(folder):
        raise ConfigError(f"{key}: no such directory: {folder}")
    problem = image_folder_problem(folder)
    if problem:
        raise ConfigError(f"{key}: {problem}")


def image_folder_problem(folder):
    """What makes `folder` no image folder (no class sub-folders, or nothing in them), or None. Cheap: it
    stops at the first class folder holding a file (image_folder checks the files themselves)."""
    try:
        classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    except OSError as error:
        return f"cannot read {folder}: {error.strerror or error}"
    if not classes:
        return f"{folder} has no class sub-folders (expected {folder}/<class name>/<image files>)"
    for name in classes:
        try:
            with os.scandir(os.path.join(folder, name)) as entries:  # closed at the first file found
                if any(entry.is_file() for entry in entries):
                    return None
        except OSError:
            continue
    return (
        f"none of the {len(classes)} class sub-folders of {folder} holds a file (expected "
        f"{folder}/<class name>/<image files>)"
    )
