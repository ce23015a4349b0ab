"""Glyphs: an embedded many-class image set for zero-shot retrieval, rendered from the fonts matplotlib ships.

Each class is one character (Latin, Greek, Cyrillic, Armenian, Georgian and Hebrew letters, digits and
symbols); each image draws it in a random face (DejaVu Sans / Sans Mono / Serif and STIX General in four
weights and slants, and Computer Modern for ASCII letters and digits), at a random size, rotation, position
and stroke weight, with a random blur. The glyph is scaled by its bounding box, so size and position carry
no class information: classes differ by shape alone. Split by class like CUB-200: `"train"` holds half
of the characters, `"test"` the other half, so evaluation is on characters never seen in training.

Look-alikes are not separate classes. `select_classes` renders every candidate in every face, normalised as
the images are, and keeps a character only if its shape distance (modified Hausdorff, minimised over the
rotations the images can have) to every kept class is large in most faces: Greek Alpha and Cyrillic A go (they
are Latin A), so do `o` (a small `O` once size is random), `c`, `s`, `v`... A second check (`confusions`)
drops the later of two classes whose images are each other's nearest raw-pixel neighbours as often as exact
homoglyphs' (`M` / Cyrillic `м`, `K` / Greek `κ`). `tools/make_glyph_classes.py` runs both and writes the
class list, with what each dropped character looked like, to `tfdml/data/glyph_classes.py`. The glyph data
set guide says more.

Images are generated in a few seconds and cached under `~/.cache/tfdml/glyphs` (or `$TFDML_CACHE/glyphs`),
keyed by every parameter and the font files, and are identical for a given seed.
"""

import dataclasses
import functools
import hashlib
import os
import warnings

import matplotlib
import numpy as np
from fontTools.ttLib import TTFont
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from scipy import ndimage

from tfdml.data import _keywords
from tfdml.data.sources import array_source

# Faces with Unicode character maps (each drawn in the four weights/slants the files provide).
UNICODE_FACES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)
# Computer Modern maps ASCII codes to TeX's font positions: only letters and digits are the characters
# their code says, so these faces draw those and nothing else.
TEX_FACES = ("cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmti10.ttf", "cmb10.ttf")
TEX_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

# Candidate characters in priority order: of two look-alikes the earlier one is kept.
CANDIDATE_BLOCKS = (
    ("digits", "0123456789"),
    ("latin_upper", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    ("latin_lower", "abcdefghijklmnopqrstuvwxyz"),
    ("ascii_symbols", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    ("latin1_symbols", "¡¢£¤¥¦§©«¬®°±µ¶¿×÷ßÞþÐðÆæØøŒœŁłƒ"),
    (
        "greek",
        "".join(chr(c) for c in range(0x391, 0x3AA) if c != 0x3A2) + "".join(chr(c) for c in range(0x3B1, 0x3CA)),
    ),
    ("cyrillic", "".join(chr(c) for c in range(0x410, 0x450))),
    ("armenian", "".join(chr(c) for c in range(0x531, 0x557)) + "".join(chr(c) for c in range(0x561, 0x587))),
    ("georgian", "".join(chr(c) for c in range(0x10D0, 0x10FB))),
    ("hebrew", "".join(chr(c) for c in range(0x5D0, 0x5EB))),
    ("math", "∀∂∃∅∇∈∋∏∑√∝∞∠∧∨∩∪∫∮∴∵≈≠≡≤≥⊂⊃⊆⊕⊗⊥⋅⌀⌂⌐⌘"),
    ("arrows", "←↑→↓↔↕↖↗⇐⇑⇒⇓⇔↩↪↺↻"),
    ("shapes", "■□▲△▶▷▼▽◀◁◆◇○◎●◐◑★☆☀☁☂☎☐☑☒☛☺☹♀♂♠♡♣♦♪♫✓✗✚✱❄"),
)

MIN_FACES = 4  # a class needs this many faces that draw it
RENDER_SIZE = 64  # font size of the master renderings (pixels)
NORMAL_SIDE = 24  # look-alike check: the glyph's longer side after normalisation
# Look-alike thresholds, in pixels of mean ink displacement at NORMAL_SIDE (see `face_distances`). Set so
# that every case pair that differs only in size (o/O, c/C, s/S, v/V, w/W, x/X, z/Z, Cyrillic ш/Ш, л/Л ...:
# medians 0.26-0.37) is one class while P/F (0.40), O/D (0.40), n/u (0.47) stay two.
LOOKALIKE_SIMILAR = 0.38  # median over the common faces below this: look-alikes
LOOKALIKE_SAME = 0.12  # ... or below this in at least a quarter of them: the same shape there
# Image check (`confusions`): two classes are look-alikes when, over CONFUSION_SEEDS data sets of 20 images
# per class at 32 px (the job's), this fraction of one class's images (both ways, summed) have their nearest
# neighbour in the other. Exact homoglyphs score 0.5-1.0 and M / м, K / κ, r / Γ, Σ / ∑, Д / д 0.47-0.55,
# while distinct but close shapes (d / ժ, u / ∪, T / τ, Ш / Щ, u / и) stay at 0.20-0.27; 0 / O reads 0.295.
CONFUSION_LIMIT = 0.3
CONFUSION_SEEDS = tuple(range(10))
DEFAULT_ROTATION = 12.0  # images are rotated by up to +-this many degrees
DEFAULT_SCALE = (0.55, 0.95)  # the glyph's longer side, a fraction of the image side drawn in this range
DEFAULT_BLUR = 0.8  # Gaussian blur radius drawn up to this many pixels (at 32 px)
CACHE_VERSION = 1


def font_dir():
    """The folder of TrueType files that ships inside matplotlib."""
    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf")


def _font_path(face):
    return os.path.join(font_dir(), face)


@functools.cache
def _font(face, size=RENDER_SIZE):
    return ImageFont.truetype(_font_path(face), size)


@functools.cache
def _cmap(face):
    with TTFont(_font_path(face), lazy=True) as font:
        return frozenset(font.getBestCmap() or ())


def render_glyph(char, face, rotation=0.0, size=RENDER_SIZE):
    """`char` drawn white on black in `face`, rotated by `rotation` degrees (counter-clockwise) and cropped
    to its ink: a `uint8` array, or `None` when the face draws nothing there. The upright master renderings
    are kept (read-only): the face check and every later rendering of the character draw from the same ones."""
    if rotation == 0 and size == RENDER_SIZE:
        return _master(char, face)
    return _render(char, face, rotation, size)


@functools.lru_cache(maxsize=8192)  # about 2 kB each: every class in every face fits
def _master(char, face):
    glyph = _render(char, face, 0.0, RENDER_SIZE)
    if glyph is not None:
        glyph.flags.writeable = False
    return glyph


def _render(char, face, rotation, size):
    canvas = Image.new("L", (3 * size, 3 * size), 0)
    ImageDraw.Draw(canvas).text((1.5 * size, 1.5 * size), char, font=_font(face, size), fill=255, anchor="mm")
    if rotation:
        canvas = canvas.rotate(rotation, resample=Image.BILINEAR)
    box = canvas.getbbox()
    if box is None:
        return None
    return np.asarray(canvas.crop(box))


@functools.cache
def faces_for(char):
    """The faces that map `char` in their character table and draw ink for it (no blank glyph)."""
    faces = list(UNICODE_FACES) + (list(TEX_FACES) if char in TEX_CHARS else [])
    return [face for face in faces if ord(char) in _cmap(face) and render_glyph(char, face) is not None]


def candidates(min_faces=MIN_FACES):
    """`{char: faces}` for every candidate drawn by at least `min_faces` faces, in priority order."""
    result = {}
    for _, chars in CANDIDATE_BLOCKS:
        for char in chars:
            faces = faces_for(char)
            if len(faces) >= min_faces and char not in result:
                result[char] = faces
    return result


def normalise(glyph, side=NORMAL_SIDE, blur=0.0):
    """A cropped glyph -> float32 `[side + 4, side + 4]` in [0, 1]: longer side scaled to `side`, centred,
    optionally blurred."""
    height, width = glyph.shape
    scale = side / max(height, width)
    new = (max(1, round(width * scale)), max(1, round(height * scale)))
    image = Image.fromarray(glyph).resize(new, Image.BILINEAR)
    canvas = Image.new("L", (side + 4, side + 4), 0)
    canvas.paste(image, ((side + 4 - new[0]) // 2, (side + 4 - new[1]) // 2))
    if blur:
        canvas = canvas.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(canvas, np.float32) / 255.0


def face_distances(chars_faces, max_rotation=DEFAULT_ROTATION):
    """Distance between every two candidates in every face, `[faces, n, n]` (NaN where a face lacks one
    of the two), in pixels at a longer side of `NORMAL_SIDE`.

    For each face that draws both characters: the modified Hausdorff distance (Dubuisson and Jain, 1994:
    the larger of the two mean distances from one shape's ink pixels to the other's nearest ink) between
    their normalised renderings, minimised over relative rotations within `2 * max_rotation` (each image
    is rotated by up to `max_rotation`). It ignores stroke weight (a thin stroke lies inside a thick one)
    and counts every misplaced stroke, however thin.
    """
    chars = list(chars_faces)
    index = {c: i for i, c in enumerate(chars)}
    faces = sorted({f for fs in chars_faces.values() for f in fs})
    rotations = np.linspace(-2 * max_rotation, 2 * max_rotation, 5) if max_rotation else np.zeros(1)
    per_face = []
    for face in faces:
        members = [c for c in chars if face in chars_faces[c]]
        ink = np.stack([normalise(render_glyph(c, face)).ravel() > 0.5 for c in members])
        turned = np.stack([[normalise(render_glyph(c, face, r)) > 0.5 for r in rotations] for c in members])
        # distance from every pixel to the nearest ink of each turned rendering: [m, rotations, pixels]
        nearest = np.stack([[ndimage.distance_transform_edt(~mask).ravel() for mask in row] for row in turned])
        turned_ink = turned.reshape(len(members), len(rotations), -1)
        upright_nearest = np.stack([ndimage.distance_transform_edt(~m.reshape(turned.shape[2:])).ravel() for m in ink])
        counts = ink.sum(1).astype(np.float32)
        # mean distance of a's ink to turned b, and of turned b's ink to a: [m, m, rotations]
        a_to_b = np.einsum("ip,jrp->ijr", ink.astype(np.float32), nearest) / counts[:, None, None]
        b_to_a = np.einsum("jrp,ip->ijr", turned_ink.astype(np.float32), upright_nearest) / turned_ink.sum(2)[
            None
        ].astype(np.float32)
        mhd = np.maximum(a_to_b, b_to_a).min(axis=2)
        mhd = np.minimum(mhd, mhd.T)
        ids = np.array([index[c] for c in members])
        full = np.full((len(chars), len(chars)), np.nan, np.float32)
        full[np.ix_(ids, ids)] = mhd
        per_face.append(full)
    return np.stack(per_face)


def lookalikes(distances, similar=LOOKALIKE_SIMILAR, same=LOOKALIKE_SAME):
    """`[n, n]` booleans from `face_distances`: two characters are look-alikes when their median distance
    over the faces that draw both is below `similar`, or when they are the same shape (below `same`) in at
    least a quarter of those faces (`l` / `I` in sans-serif faces)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pairs (no common face) give NaN: not alike
        median = np.nanquantile(distances, 0.5, axis=0, method="lower")
        low = np.nanquantile(distances, 0.25, axis=0, method="lower")
    return (median < similar) | (low < same), median


def _undo_size_and_position(image, side=20):
    """An image -> float32 `[(side + 2) ** 2]`, zero mean and unit norm: cropped to its ink (above 30 % of
    its brightest pixel: the blur's halo is not ink), longer side scaled to `side`, centred."""
    rows, cols = np.nonzero(image > 0.3 * image.max())
    crop = Image.fromarray(image[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1])
    scale = side / max(crop.size)
    crop = crop.resize((max(1, round(crop.size[0] * scale)), max(1, round(crop.size[1] * scale))), Image.BILINEAR)
    canvas = Image.new("L", (side + 2, side + 2), 0)
    canvas.paste(crop, ((side + 2 - crop.size[0]) // 2, (side + 2 - crop.size[1]) // 2))
    vector = np.asarray(canvas, np.float32).ravel()
    vector -= vector.mean()
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def confusions(classes, seeds=CONFUSION_SEEDS, images_per_class=20, image_size=32):
    """`[n, n]`: for every two classes `a`, `b` the fraction of `a`'s images whose nearest neighbour is one of
    `b`'s, plus the same from `b` to `a`, pooled over one data set per seed (`render_images` with those
    arguments).

    Each image is cropped to its ink and scaled to a fixed longer side (undoing the random size and
    position) and compared by normalised cross-correlation of raw pixels with every other image of its data
    set. It judges the images as drawn, in every face, stroke weight, rotation and blur, where
    `face_distances` compares clean renderings face by face.
    """
    count = np.zeros((len(classes), len(classes)))
    for seed in seeds:
        images, labels = render_images(classes, image_size=image_size, images_per_class=images_per_class, seed=seed)
        vectors = np.stack([_undo_size_and_position(image) for image in images])
        for start in range(0, len(vectors), 2048):
            similarity = vectors[start : start + 2048] @ vectors.T
            similarity[np.arange(len(similarity)), np.arange(start, start + len(similarity))] = -np.inf
            np.add.at(count, (labels[start : start + 2048], labels[np.argmax(similarity, axis=1)]), 1)
    rate = count / (images_per_class * len(seeds))
    rate = rate + rate.T
    np.fill_diagonal(rate, 0.0)
    return rate


def select_classes(
    min_faces=MIN_FACES,
    similar=LOOKALIKE_SIMILAR,
    same=LOOKALIKE_SAME,
    max_rotation=DEFAULT_ROTATION,
    confusion_limit=CONFUSION_LIMIT,
):
    """`(classes, dropped, confused)`: the candidates (`candidates`, in priority order) that look like no
    earlier kept one, as a string; `{dropped_char: (kept_char, median_distance)}` naming the closest
    look-alike by shape distance of each candidate dropped in the first pass; and `{char: (kept_char,
    rate)}` for those of the first pass's classes that the image check (`confusions`) then finds confused
    with an earlier kept class at `confusion_limit` or more (a `dropped` character's twin may be one of
    these: look its twin up there)."""
    chars_faces = candidates(min_faces)
    chars = list(chars_faces)
    alike, median = lookalikes(face_distances(chars_faces, max_rotation), similar, same)
    kept, dropped = [], {}
    for i, char in enumerate(chars):
        twins = [(median[i, j], j) for j in kept if alike[i, j]]
        if twins:
            distance, j = min(twins)
            dropped[char] = (chars[j], round(float(distance), 3))
        else:
            kept.append(i)
    classes, confused = "".join(chars[i] for i in kept), {}
    while True:  # dropping a class changes the others' nearest neighbours: measure again until none goes
        rate = confusions(classes)
        kept, found = [], {}
        for i, char in enumerate(classes):
            twins = [(rate[i, j], j) for j in kept if rate[i, j] >= confusion_limit]
            if twins:
                value, j = max(twins)
                found[char] = (classes[j], round(float(value), 3))
            else:
                kept.append(i)
        if not found:
            return classes, dropped, confused
        confused.update(found)
        classes = "".join(classes[i] for i in kept)


def _classes():
    # Imported when needed: tools/make_glyph_classes.py uses this module to write glyph_classes.py.
    from tfdml.data.glyph_classes import CLASSES

    return CLASSES


def class_split(classes, split):
    """Indices of the classes in `split`: a fixed shuffle of the class list, first half `"train"`, second
    half `"test"` (both halves mix every script), or `"all"`."""
    order = np.random.default_rng(2011).permutation(len(classes))
    half = len(classes) // 2
    if split == "train":
        return np.sort(order[:half])
    if split == "test":
        return np.sort(order[half:])
    if split == "all":
        return np.arange(len(classes))
    raise ValueError(f"glyphs: split must be 'train', 'test' or 'all', got {split!r}.")


def _draw(glyph, image_size, params):
    """One image from a master rendering and its random parameters."""
    image = Image.fromarray(glyph)
    if params["weight"] > 0:
        image = image.filter(ImageFilter.MaxFilter(2 * params["weight"] + 1))
    elif params["weight"] < 0:
        thinner = image.filter(ImageFilter.MinFilter(3))
        if thinner.getbbox() is not None:
            image = thinner
    image = image.rotate(params["rotation"], resample=Image.BILINEAR, expand=True)
    image = image.crop(image.getbbox())
    width, height = image.size
    scale = params["scale"] * image_size / max(width, height)
    new = (max(1, round(width * scale)), max(1, round(height * scale)))
    image = image.resize(new, Image.BILINEAR, reducing_gap=2.0)
    canvas = Image.new("L", (image_size, image_size), 0)
    free_x, free_y = image_size - new[0], image_size - new[1]
    left = int(round(free_x / 2 + params["shift_x"] * free_x / 2))
    top = int(round(free_y / 2 + params["shift_y"] * free_y / 2))
    canvas.paste(image, (left, top))
    if params["blur"] > 0:
        canvas = canvas.filter(ImageFilter.GaussianBlur(params["blur"] * image_size / 32.0))
    return np.asarray(canvas)


@dataclasses.dataclass(frozen=True)
class GlyphRendering:
    """How the glyph images are drawn: the settings that `glyphs`, `load_images` (and its cache key) and
    `render_images` take as keyword arguments of the same names, checked when made.

    Args:
      image_size: side of the square images, at least 8 (default 32).
      images_per_class: images drawn per character (default 20).
      seed: draws the faces, rotations, sizes, positions, stroke weights and blurs (default 0).
      max_rotation: images are rotated by up to this many degrees either way (default `DEFAULT_ROTATION`,
        12). The look-alike removal assumed 12: much larger angles bring shapes such as `n`/`u` or `6`/`9`
        closer.
      scale: `(low, high)` range of the glyph's longer side as a fraction of `image_size`, within (0, 1]
        (default `DEFAULT_SCALE`, `(0.55, 0.95)`).
      max_blur: largest Gaussian blur radius, in pixels at 32 px, scaled with `image_size` (default
        `DEFAULT_BLUR`, 0.8).

    Example:
      >>> GlyphRendering(image_size=16).images_per_class
      20
      >>> GlyphRendering(image_size=4)
      Traceback (most recent call last):
      ValueError: glyphs: image_size must be at least 8, got 4.
    """

    image_size: int = 32
    images_per_class: int = 20
    seed: int = 0
    max_rotation: float = DEFAULT_ROTATION
    scale: tuple = DEFAULT_SCALE
    max_blur: float = DEFAULT_BLUR

    def __post_init__(self):
        if int(self.image_size) < 8:
            raise ValueError(f"glyphs: image_size must be at least 8, got {self.image_size}.")
        if int(self.images_per_class) < 1:
            raise ValueError(f"glyphs: images_per_class must be positive, got {self.images_per_class}.")
        if not float(self.max_rotation) >= 0.0:
            raise ValueError(f"glyphs: max_rotation must be at least 0 degrees, got {self.max_rotation}.")
        scale = tuple(float(s) for s in self.scale)
        if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
            raise ValueError(f"glyphs: scale must be (low, high) with 0 < low <= high <= 1, got {self.scale!r}.")
        if not float(self.max_blur) >= 0.0:
            raise ValueError(f"glyphs: max_blur must be at least 0, got {self.max_blur}.")
        types = {"image_size": int, "images_per_class": int, "seed": int, "max_rotation": float, "max_blur": float}
        for field, kind in types.items():  # frozen: the converted values replace the given ones once, here
            object.__setattr__(self, field, kind(getattr(self, field)))
        object.__setattr__(self, "scale", scale)


def render_images(classes, **rendering):
    """`uint8 [len(classes) * images_per_class, image_size, image_size]` images and their class indices, drawn
    as `rendering` (`GlyphRendering`'s fields, as keywords) says.

    Each class's images depend only on `seed` and its character (not on the other classes): per image a
    random face among those that draw it, stroke weight (thinner, as drawn, or 1-2 px bolder at the master
    size), rotation within +-`max_rotation` degrees, longer side at `scale` of the image, position within
    the free margin, and a Gaussian blur of radius up to `max_blur` px (at 32 px).
    """
    settings = GlyphRendering(**rendering)
    image_size, images_per_class = settings.image_size, settings.images_per_class
    images = np.zeros((len(classes) * images_per_class, image_size, image_size), np.uint8)
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), images_per_class)
    for label, char in enumerate(classes):
        faces = faces_for(char)
        if len(faces) < 1:
            raise ValueError(f"glyphs: no font draws {char!r} (U+{ord(char):04X}).")
        rng = np.random.default_rng([settings.seed, ord(char)])
        for k in range(images_per_class):
            face = faces[rng.integers(len(faces))]
            params = {
                "weight": int(rng.choice([-1, 0, 0, 1, 2])),
                "rotation": float(rng.uniform(-settings.max_rotation, settings.max_rotation)),
                "scale": float(rng.uniform(*settings.scale)),
                "shift_x": float(rng.uniform(-1, 1)),
                "shift_y": float(rng.uniform(-1, 1)),
                "blur": float(rng.uniform(0, settings.max_blur)),
            }
            images[label * images_per_class + k] = _draw(render_glyph(char, face), image_size, params)
    return images, labels


def cache_dir():
    root = os.environ.get("TFDML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfdml"
    )
    return os.path.join(root, "glyphs")


def _cache_key(classes, settings):
    fonts = [(f, os.path.getsize(_font_path(f))) for f in UNICODE_FACES + TEX_FACES]
    text = repr((CACHE_VERSION, classes, sorted(settings.items()), fonts))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def load_images(classes=None, *, cache=True, **rendering):
    """`render_images(classes, **rendering)`, every class by default, read from the on-disk cache when it was
    generated before (`cache`); the cache key is the class list, the checked `GlyphRendering` and the fonts."""
    classes = _classes() if classes is None else classes
    settings = dataclasses.asdict(GlyphRendering(**rendering))
    path = os.path.join(cache_dir(), f"glyphs-{_cache_key(classes, settings)}.npz") if cache else None
    if path and os.path.exists(path):
        try:
            with np.load(path) as data:
                return data["images"], data["labels"]
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is regenerated below
    images, labels = render_images(classes, **settings)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(temporary, images=images, labels=labels)
        os.replace(temporary, path)
    return images, labels


@_keywords.takes_fields(GlyphRendering)
def glyphs(split="train", *, classes=None, cache=True, **rendering):
    """Rendered characters as a source of `uint8 [image_size, image_size, 1]` images (white ink on black).

    Args:
      split: `"train"` (half of the classes), `"test"` (the other half: zero-shot evaluation) or `"all"`.
        The halves are a fixed shuffle of the class list, the same for every seed.
      classes: the characters, one class each; default `tfdml.data.glyph_classes.CLASSES`.
      cache: read and write the images under `cache_dir()`.
      image_size, images_per_class, seed, max_rotation, scale, max_blur: as in `GlyphRendering`.

    Labels are indices into the class string and keep their value in every split; the characters are in
    the returned source's `class_names` attribute (indexed by label).

    Example:
      >>> train, test = tfdml.data.glyphs("train"), tfdml.data.glyphs("test")
      >>> ds = tfdml.data.class_balanced_dataset(train, 22, 3, image_size=32)
    """
    settings = GlyphRendering(**rendering)  # checked before any work
    classes = _classes() if classes is None else str(classes)
    if len(set(classes)) != len(classes):
        raise ValueError("glyphs: classes must be distinct characters.")
    keep = class_split(classes, split)
    images, labels = load_images(classes, cache=cache, **dataclasses.asdict(settings))
    mask = np.isin(labels, keep)
    images, labels = images[mask][..., None], labels[mask]
    source = array_source(
        images,
        labels,
        num_classes=len(classes),
        name=f"glyphs({split}: {len(np.unique(labels))} of {len(classes)} characters)",
    )
    source.class_names = list(classes)
    return source


def glyph_arrays(split="train", **options):
    """`(images uint8 [n, image_size, image_size, 1], labels [n], classes)` of one split: the arrays of
    `glyphs(split, **options)`, with its arguments."""
    source = glyphs(split, **options)
    return source.images, source.labels, "".join(source.class_names)
