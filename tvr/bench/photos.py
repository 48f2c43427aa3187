"""Real photographs that ship with installable packages, as textures for the synthetic generator's ``objects``
content (``tvr synth --content objects``).

Why: a pretrained image tower (ImageNet EfficientNet, CLIP) sees nothing it knows in coloured polygons; composed
into short clips with motion and order ("a cat, then a cup of coffee"), these photographs give it real content while
the generator keeps full control of what happens when.

Where they come from (read in place at run time; never copied into the repository):

* scikit-image's sample images that are **bundled in its wheel** (``skimage/data/*.png|jpg``; the ones its
  ``skimage.data`` fetches with pooch on first use are not listed here, so nothing is downloaded);
* the example images of Debian's ``opencv-doc`` package (``apt-get install opencv-doc``), under
  ``/usr/share/doc/opencv-doc/examples/data`` (``TVR_OPENCV_DATA`` overrides the folder).

A photo whose package is not installed is simply unavailable: :func:`available_photos` lists the ones found and
:func:`require_photos` raises a :class:`PhotoError` that says what to install.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvr.utils.errors import UserError

#: side of the square texture every photograph is resampled to (renderers sample it at any size)
TEXTURE_SIZE = 128
#: where Debian's opencv-doc puts its example images
OPENCV_DOC_DATA = Path("/usr/share/doc/opencv-doc/examples/data")


class PhotoError(UserError, FileNotFoundError):
    """The photographs a synthetic set asks for are not installed."""


@dataclass(frozen=True)
class Photo:
    """One photograph: where it lives, which square of it shows the object, and how captions name it.

    ``centre``: (x, y) of the square crop's centre as fractions of the width / height (the crop is the largest square
    around it that fits); ``nouns``: singular noun phrases, the first one canonical (used in the caption that names
    every object)."""

    name: str
    source: str  # "skimage" | "opencv-doc"
    file: str
    nouns: tuple[str, ...]
    centre: tuple[float, float] = (0.5, 0.5)


PHOTOS: tuple[Photo, ...] = (
    # scikit-image (files inside the wheel)
    Photo("cat", "skimage", "chelsea.png", ("cat", "tabby cat", "kitten")),
    Photo("coffee", "skimage", "coffee.png", ("cup of coffee", "coffee cup", "cup of espresso")),
    Photo("astronaut", "skimage", "astronaut.png", ("astronaut", "woman in a spacesuit", "space traveller")),
    Photo("rocket", "skimage", "rocket.jpg", ("rocket", "rocket on a launch pad", "space rocket"), (0.49, 0.5)),
    Photo("motorcycle", "skimage", "motorcycle_left.png", ("motorcycle", "red motorbike", "motorbike")),
    Photo("horse", "skimage", "horse.png", ("horse", "horse silhouette", "black horse")),
    Photo("cameraman", "skimage", "camera.png", ("man with a camera", "photographer", "cameraman")),
    Photo("coins", "skimage", "coins.png", ("pile of coins", "collection of old coins", "set of coins")),
    Photo("moon", "skimage", "moon.png", ("moon surface", "lunar surface", "crater on the moon")),
    Photo("galaxies", "skimage", "hubble_deep_field.jpg", ("field of galaxies", "deep space image", "night sky")),
    Photo("bricks", "skimage", "brick.png", ("brick wall", "wall of bricks", "brick pavement")),
    Photo("grass", "skimage", "grass.png", ("patch of grass", "lawn", "meadow")),
    Photo("gravel", "skimage", "gravel.png", ("pile of gravel", "bed of pebbles", "heap of stones")),
    Photo("page", "skimage", "page.png", ("page of text", "printed page", "document")),
    Photo("retina", "skimage", "retina.jpg", ("retina", "eye fundus", "retina scan")),
    Photo("tissue", "skimage", "ihc.png", ("stained tissue", "microscope slide", "tissue sample")),
    # Debian opencv-doc example images
    Photo("apple", "opencv-doc", "apple.jpg", ("apple", "red apple", "shiny apple")),
    Photo("orange", "opencv-doc", "orange.jpg", ("orange", "ripe orange", "citrus fruit")),
    Photo("baboon", "opencv-doc", "baboon.jpg", ("baboon", "mandrill", "monkey face")),
    Photo("butterfly", "opencv-doc", "butterfly.jpg", ("butterfly", "black and white butterfly", "moth")),
    Photo("fish", "opencv-doc", "HappyFish.jpg", ("cartoon fish", "colourful fish", "fish drawing")),
    Photo(
        "squirrel", "opencv-doc", "squirrel_cls.jpg", ("squirrel", "red squirrel", "squirrel on a branch"), (0.4, 0.5)
    ),
    Photo("footballer", "opencv-doc", "messi5.jpg", ("football player", "soccer player", "footballer"), (0.35, 0.5)),
    Photo("fruit", "opencv-doc", "fruits.jpg", ("pile of sliced fruit", "slice of orange", "cut citrus fruit")),
    Photo("sweets", "opencv-doc", "smarties.png", ("handful of sweets", "scatter of candies", "heap of sweets")),
    Photo(
        "painting",
        "opencv-doc",
        "starry_night.jpg",
        ("painting of a starry night", "van gogh painting", "swirling painting"),
    ),
    Photo("building", "opencv-doc", "building.jpg", ("tall building", "hotel building", "office block")),
    Photo("palace", "opencv-doc", "home.jpg", ("palace", "old building with a tower", "ornate building"), (0.6, 0.5)),
    Photo("dog", "opencv-doc", "chicky_512.png", ("dog", "small dog", "pekingese")),
    Photo("town", "opencv-doc", "aero1.jpg", ("aerial view of a town", "town from above", "aerial photo")),
    Photo("cards", "opencv-doc", "cards.png", ("spread of playing cards", "deck of cards", "set of cards")),
    Photo("graffiti", "opencv-doc", "graf1.png", ("graffiti", "graffiti wall", "piece of street art")),
    Photo("street", "opencv-doc", "leuvenA.jpg", ("street with old houses", "old town street", "row of brick houses")),
    Photo("plant", "opencv-doc", "aloeL.jpg", ("aloe plant", "potted plant", "aloe vera")),
    Photo("toys", "opencv-doc", "rubberwhale1.png", ("toy whale", "rubber whale", "pile of toys")),
)
PHOTOS_BY_NAME: dict[str, Photo] = {p.name: p for p in PHOTOS}


def skimage_data_dir() -> Path | None:
    """scikit-image's bundled sample-image folder, or None when scikit-image is not installed."""
    try:
        import skimage.data
    except ImportError:
        return None
    return Path(skimage.data.__file__).resolve().parent


def opencv_data_dir() -> Path:
    return Path(os.environ.get("TVR_OPENCV_DATA", str(OPENCV_DOC_DATA)))


def photo_path(photo: Photo) -> Path | None:
    """The installed file of ``photo``, or None when its package (or the file) is absent."""
    folder = skimage_data_dir() if photo.source == "skimage" else opencv_data_dir()
    if folder is None:
        return None
    path = folder / photo.file
    return path if path.is_file() else None


def available_photos() -> list[str]:
    """Names of the photographs installed on this machine, in catalogue order."""
    return [p.name for p in PHOTOS if photo_path(p) is not None]


def require_photos(minimum: int) -> list[str]:
    """The installed photographs; raise PhotoError (naming what to install) when fewer than ``minimum``."""
    found = available_photos()
    if len(found) < minimum:
        missing = sorted({p.source for p in PHOTOS if photo_path(p) is None})
        how = {"skimage": "pip install scikit-image", "opencv-doc": "apt-get install opencv-doc"}
        raise PhotoError(
            f"synthetic 'objects' content needs at least {minimum} photographs, {len(found)} are installed; "
            f"missing sources: {', '.join(f'{s} ({how[s]})' for s in missing) or 'none'}"
        )
    return found


@functools.cache
def load_texture(name: str, size: int = TEXTURE_SIZE) -> np.ndarray:
    """``name``'s photograph as a float32 [size, size, 3] RGB texture in 0..255: the largest square around the
    photo's centre, resampled with anti-aliasing (grey-scale photos are repeated over the channels; an alpha
    channel is dropped). Read-only: callers share the cached array."""
    from skimage.io import imread
    from skimage.transform import resize

    photo = PHOTOS_BY_NAME.get(name)
    if photo is None:
        raise PhotoError(f"unknown photograph {name!r}; known: {sorted(PHOTOS_BY_NAME)}")
    path = photo_path(photo)
    if path is None:
        raise PhotoError(
            f"photograph {name!r} ({photo.source}: {photo.file}) is not installed; "
            f"{'pip install scikit-image' if photo.source == 'skimage' else 'apt-get install opencv-doc'}"
        )
    image = np.asarray(imread(path))
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    image = image[:, :, :3].astype(np.float64)
    if image.max() <= 1.0:  # a float image in 0..1
        image = image * 255.0
    h, w = image.shape[:2]
    side = min(h, w)
    cx, cy = photo.centre
    x0 = int(round(min(max(cx * w - side / 2, 0), w - side)))
    y0 = int(round(min(max(cy * h - side / 2, 0), h - side)))
    square = image[y0 : y0 + side, x0 : x0 + side]
    texture = resize(square, (size, size), order=1, anti_aliasing=True, preserve_range=True)
    texture = np.clip(texture, 0.0, 255.0).astype(np.float32)
    texture.setflags(write=False)
    return texture


__all__ = [
    "PHOTOS",
    "PHOTOS_BY_NAME",
    "Photo",
    "PhotoError",
    "TEXTURE_SIZE",
    "available_photos",
    "load_texture",
    "opencv_data_dir",
    "photo_path",
    "require_photos",
    "skimage_data_dir",
]
