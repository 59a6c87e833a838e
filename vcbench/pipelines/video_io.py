"""Clip files: lossless PNG frames (what scoring reads), an MP4 preview, and their checksum.

PNG frames, not FFV1, are the lossless copy: any reader decodes them to the exact uint8
pixels, and one file per frame lets a partial clip be told apart from a finished one.
The checksum is the SHA-256 of the PNG files' bytes in frame order, so it is checked
against the files on disk without decoding anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

PREVIEW_FPS = 16  # frames per second of the clips made for people (preview.mp4, report.html)


def frame_name(i: int) -> str:
    return f"{i:06d}.png"


def write_frames(frames: np.ndarray, directory: Path) -> str:
    """Write uint8 (F, H, W, 3) as PNGs into a fresh `directory`, atomically: into a temp
    folder first, renamed into place only when every frame is on disk. Returns the sha256."""
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp / frame_name(i), format="PNG", compress_level=6)
    digest = frames_sha256(tmp)
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return digest


def frames_sha256(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.glob("*.png")):
        h.update(path.read_bytes())
    return h.hexdigest()


def read_frames(directory: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(directory.glob("*.png"))])


def write_npy(path: Path, array: np.ndarray) -> None:
    """np.save, atomically (a temp name in the same folder, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def can_write_mp4() -> bool:
    """Whether PyAV is importable. It is a declared dependency, but GPU images run from a source
    tree (`ENV=system`) may lack it; the preview is for people and never scored, so a clip is
    made without one rather than lost."""
    return importlib.util.find_spec("av") is not None


def write_mp4(frames: np.ndarray, path: Path, fps: int = PREVIEW_FPS) -> None:
    """H.264 preview for people (lossy; never scored). Written to a temp name, then renamed."""
    import av

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.mp4")
    height, width = frames.shape[1:3]
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        # yuv420p needs even sides; the preview pads by one pixel rather than failing.
        stream.width, stream.height = width + width % 2, height + height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for frame in frames:
            if frame.shape[0] != stream.height or frame.shape[1] != stream.width:
                frame = np.pad(frame, ((0, stream.height - height), (0, stream.width - width), (0, 0)), mode="edge")
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode())
    os.replace(tmp, path)
