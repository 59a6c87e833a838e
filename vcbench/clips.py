"""Reading one clip into memory exactly as it was written: (frames, height, width, channels).

A clip is a video file (decoded with PyAV), a directory of image frames sorted by name, or a
`.npy` array. Scores must compare the pixels a method produced, so each reader says whether it
was lossless: FFV1/PNG-style codecs with RGB planes are; anything else (H.264, JPEG, YUV with
subsampled chroma) is accepted but marked with the reason, and the score output flags it.

Frames stay uint8 unless the clip is a float `.npy`, the one format that can carry NaN/inf from
a broken pipeline; the scorer reports those frames instead of averaging over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcbench.errors import UserError

IMAGE_SUFFIXES = {".png", ".bmp", ".tif", ".tiff", ".jpg", ".jpeg", ".webp"}
_LOSSY_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".webp"}
VIDEO_SUFFIXES = {".mkv", ".mp4", ".mov", ".avi", ".webm", ".nut"}
# Codecs that store exactly what they were given...
_LOSSLESS_CODECS = {"ffv1", "png", "rawvideo", "huffyuv", "ffvhuff", "utvideo", "qtrle", "r210"}
# ...and pixel layouts that hold RGB (or grey) without chroma subsampling or a YUV round trip.
_EXACT_PIXEL_FORMATS = {"gbrp", "rgb24", "bgr24", "bgr0", "rgb0", "0rgb", "0bgr", "rgba", "bgra",
                        "argb", "abgr", "gbrap", "gray", "pal8"}


@dataclass
class Clip:
    frames: np.ndarray  # (T, H, W, C); uint8, or float32 in [0, 255] from a .npy
    source: str
    lossy: str | None  # None when read losslessly, else why it is not

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.frames.shape)


def read_clip(path: str | Path) -> Clip:
    path = Path(path)
    if path.is_dir():
        return _read_frame_dir(path)
    if not path.is_file():
        raise UserError(f"clip {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return _read_npy(path)
    if suffix in IMAGE_SUFFIXES:
        raise UserError(f"{path} is a single image; a clip is a video file or a directory of frames")
    return _read_video(path)


def _read_frame_dir(path: Path) -> Clip:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UserError(f"{path} holds no image frames ({', '.join(sorted(IMAGE_SUFFIXES))})")
    frames = [_read_image(f) for f in files]
    shapes = {f.shape for f in frames}
    if len(shapes) > 1:
        raise UserError(f"{path}: frames differ in size or channels ({sorted(shapes)})")
    lossy_suffixes = sorted({f.suffix.lower() for f in files} & _LOSSY_IMAGE_SUFFIXES)
    lossy = f"frames stored as {'/'.join(lossy_suffixes)}" if lossy_suffixes else None
    return Clip(np.stack(frames), str(path), lossy)


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            if img.mode == "P":  # a palette maps exactly to RGB(A)
                img = img.convert("RGBA" if "transparency" in img.info else "RGB")
            if img.mode not in ("L", "LA", "RGB", "RGBA"):
                raise UserError(f"{path}: {img.mode} frames are not supported (need 8-bit grey or RGB)")
            array = np.asarray(img)
    except OSError as e:
        raise UserError(f"{path}: cannot read image ({e})") from None
    return array[..., None] if array.ndim == 2 else array


def _read_npy(path: Path) -> Clip:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read array ({e})") from None
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4:
        raise UserError(f"{path}: expected (frames, height, width, channels), got shape {array.shape}")
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating):
            raise UserError(f"{path}: dtype {array.dtype} is not supported (uint8, or float in [0, 255])")
        array = array.astype(np.float32)
    return Clip(array, str(path), None)


def _read_video(path: Path) -> Clip:
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise UserError(f"{path} has no video stream")
            stream = container.streams.video[0]
            codec, pix_fmt = stream.codec_context.name, stream.codec_context.format.name
            grey = pix_fmt in ("gray", "gray8")
            frames = [f.to_ndarray(format="gray" if grey else "rgb24") for f in container.decode(stream)]
    except av.FFmpegError as e:
        raise UserError(f"{path}: cannot decode video ({e})") from None
    if not frames:
        raise UserError(f"{path} has no frames")
    array = np.stack(frames)
    if grey:
        array = array[..., None]
    exact = codec in _LOSSLESS_CODECS and pix_fmt in _EXACT_PIXEL_FORMATS
    return Clip(array, str(path), None if exact else f"{codec} {pix_fmt} video")
