"""Builds the benchmark's real-artwork image folder from the desktop icon themes Debian packages: one class per
freedesktop icon name (`folder`, `user-trash`, `audio-volume-high`, ...), one image per theme that draws it,
so a class's images are the same idea drawn by different designers, and retrieval must see past each
designer's style.

    apt-get install --no-install-recommends librsvg2-bin adwaita-icon-theme breeze-icon-theme \\
        elementary-xfce-icon-theme faba-icon-theme faenza-icon-theme gnome-icon-theme \\
        gnome-icon-theme-gartoon gnome-icon-theme-nuovo gnome-icon-theme-yasis lxde-icon-theme mate-icon-theme \\
        moka-icon-theme numix-icon-theme oxygen-icon-theme paper-icon-theme papirus-icon-theme tango-icon-theme
    python benchmarks/pretrained/icons.py /tmp/icons     # -> /tmp/icons/<icon name>/<theme>.png

Licences (each theme's `/usr/share/doc/<package>/copyright`): GPL-2/3 or LGPL-3 (Faenza, Moka, Faba, Paper,
Papirus, Numix, elementary-xfce, Breeze, Oxygen, Nuovo, gartoon, YASIS, nuoveXT2, MATE), CC-BY-SA 3.0 or
LGPL-3 (Adwaita, GNOME), public domain (Tango). The images are used for measurement only and are not
redistributed with tfdml.

Per theme the largest raster of an icon up to 256 px is taken (or its scalable SVG, rendered with
`rsvg-convert` at the output size), composited on white and resized to `--size` px. Dark and light
re-colourings of a theme are not separate themes. Aliases are removed: two icon names that share a file in a
theme, or an identical image anywhere, are one drawing under two names, so the later name is dropped; so is
a name drawn by fewer than `--min-themes` themes.
"""

import argparse
import collections
import hashlib
import io
import os
import re
import subprocess

import numpy as np
from PIL import Image

ROOT = "/usr/share/icons"
THEMES = (
    "Adwaita", "Faba", "Faenza", "Moka", "Numix", "Nuovo", "Paper", "Papirus", "Tango", "breeze",
    "elementary-xfce", "gartoon", "gnome", "mate", "nuoveXT2", "oxygen", "yasis",
)  # fmt: skip
SIZE_PATTERN = re.compile(r"(?:^|/)(\d+)(?:x\d+)?(?:@2x)?(?:/|$)")


def _size_of(path):
    match = SIZE_PATTERN.search(os.path.relpath(path, ROOT))
    if "scalable" in path or path.endswith(".svg"):
        return 1000  # scalable: rendered at any size, preferred over small rasters
    return int(match.group(1)) if match else 0


def theme_files(theme):
    """`{icon name: file}` of a theme: the largest raster up to 256 px, else a scalable SVG."""
    best = {}
    for folder, _, files in os.walk(os.path.join(ROOT, theme)):
        if "symbolic" in folder:
            continue
        for file in files:
            name, ext = os.path.splitext(file)
            if ext not in (".png", ".svg") or name.endswith("-symbolic"):
                continue
            path = os.path.join(folder, file)
            size = _size_of(path)
            if ext == ".png" and not 32 <= size <= 256:
                continue
            if name not in best or (size, ext == ".png") > (best[name][0], best[name][1].endswith(".png")):
                best[name] = (size, path)
    return {name: path for name, (size, path) in best.items()}


def render(path, size):
    """The icon at `path` as a `size` x `size` RGB array on white."""
    if path.endswith(".svg"):
        png = subprocess.run(
            ["rsvg-convert", "-w", str(size), "-h", str(size), "-a", path], capture_output=True, check=True
        ).stdout
        image = Image.open(io.BytesIO(png))
    else:
        image = Image.open(path)
    image = image.convert("RGBA")
    image.thumbnail((size, size), Image.LANCZOS) if max(image.size) > size else None
    if max(image.size) < size:
        image = image.resize((size * image.size[0] // max(image.size), size * image.size[1] // max(image.size)))
    canvas = Image.new("RGBA", (size, size), (255, 255, 255, 255))
    canvas.alpha_composite(image, ((size - image.size[0]) // 2, (size - image.size[1]) // 2))
    return np.asarray(canvas.convert("RGB"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="folder to write, one sub-folder per icon name")
    parser.add_argument("--size", type=int, default=128, help="side of the square images, in pixels")
    parser.add_argument("--min-themes", type=int, default=8, help="themes that must draw a name to make a class")
    args = parser.parse_args()
    files = {theme: theme_files(theme) for theme in THEMES if os.path.isdir(os.path.join(ROOT, theme))}
    drawn = collections.Counter(name for per_theme in files.values() for name in per_theme)
    names = sorted(name for name, count in drawn.items() if count >= args.min_themes)
    seen_files, seen_images, kept = set(), set(), 0
    for name in names:
        images, sources = {}, set()
        for theme, per_theme in files.items():
            if name in per_theme:
                real = os.path.realpath(per_theme[name])
                try:
                    pixels = render(real, args.size)
                except (subprocess.CalledProcessError, OSError, ValueError):
                    continue  # an SVG rsvg cannot draw, a damaged PNG
                images[theme], sources = pixels, sources | {real}
        digests = {hashlib.sha1(p.tobytes()).hexdigest() for p in images.values()}
        if sources & seen_files or digests & seen_images or len(images) < args.min_themes:
            continue  # an alias of a name already kept, or too few drawings left
        seen_files |= sources
        seen_images |= digests
        os.makedirs(os.path.join(args.output, name), exist_ok=True)
        for theme, pixels in images.items():
            Image.fromarray(pixels).save(os.path.join(args.output, name, f"{theme}.png"))
        kept += 1
    print(f"{kept} classes from {len(files)} themes in {args.output}")


if __name__ == "__main__":
    main()
