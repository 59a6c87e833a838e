"""Reading clips: lossless round trips, lossy inputs flagged, malformed inputs one-line errors."""

from __future__ import annotations

import av
import numpy as np
import pytest
from PIL import Image
from score_fixtures import smooth_clip, write_ffv1, write_frames

from vcbench.clips import read_clip
from vcbench.errors import UserError


def test_png_frames_round_trip_exactly_in_name_order(tmp_path):
    clip = smooth_clip(0, frames=4)
    write_frames(tmp_path / "frames", clip)
    got = read_clip(tmp_path / "frames")
    np.testing.assert_array_equal(got.frames, clip)
    assert got.lossy is None


def test_ffv1_mkv_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(1)
    clip = rng.integers(0, 256, (3, 24, 32, 3)).astype(np.uint8)  # noise: any chroma loss would show
    got = read_clip(write_ffv1(tmp_path / "clip.mkv", clip))
    np.testing.assert_array_equal(got.frames, clip)
    assert got.lossy is None


def test_lossy_video_is_read_but_flagged(tmp_path):
    clip = smooth_clip(2, frames=3, height=32, width=32)
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=16)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for frame in clip:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    got = read_clip(path)
    assert got.frames.shape == clip.shape
    assert got.lossy == "mpeg4 yuv420p video"


def test_jpeg_frames_are_flagged(tmp_path):
    for i, frame in enumerate(smooth_clip(3, frames=2)):
        Image.fromarray(frame).save(tmp_path / f"{i}.jpg")
    assert "jpg" in read_clip(tmp_path).lossy


def test_grey_frames_keep_one_channel(tmp_path):
    clip = smooth_clip(4, frames=2)[..., :1]
    got = read_clip(write_frames(tmp_path / "grey", clip))
    np.testing.assert_array_equal(got.frames, clip)


def test_empty_frame_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="holds no image frames"):
        read_clip(tmp_path)


def test_frames_of_different_sizes_are_a_one_line_error(tmp_path):
    write_frames(tmp_path, smooth_clip(5, frames=1, height=48))
    Image.fromarray(smooth_clip(5, frames=1, height=40)[0]).save(tmp_path / "000001.png")
    with pytest.raises(UserError, match="frames differ in size"):
        read_clip(tmp_path)


def test_undecodable_video_is_a_one_line_error(tmp_path):
    (tmp_path / "clip.mkv").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot decode video") as err:
        read_clip(tmp_path / "clip.mkv")
    assert "\n" not in str(err.value)


def test_float_npy_keeps_nan_for_the_scorer_to_report(tmp_path):
    clip = smooth_clip(6, frames=3).astype(np.float32)
    clip[1, 0, 0, 0] = np.nan
    np.save(tmp_path / "c.npy", clip)
    got = read_clip(tmp_path / "c.npy")
    assert got.frames.dtype == np.float32 and np.isnan(got.frames[1, 0, 0, 0])
