"""ToyVideo data, the caption check, the patchify VAE in WanPipeline, and the trainer (tiny runs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vcbench.cli import main
from vcbench.errors import UserError
from vcbench.pipelines import toyvideo, toywan
from vcbench.pipelines.check_tiny import check_clip, check_model, write_strip
from vcbench.pipelines.train_tiny import (
    HIGH_NOISE_BAND,
    centroids,
    draw_sigmas,
    motion_loss,
    on_shape,
    train,
)


def uint8(clip: np.ndarray) -> np.ndarray:
    return np.round(clip * 255).astype(np.uint8)


def test_toyvideo_is_a_function_of_seed_and_step():
    a, ca = toyvideo.ToyVideo(3).batch(5, 3)
    b, cb = toyvideo.ToyVideo(3).batch(5, 3)
    c, _ = toyvideo.ToyVideo(3).batch(6, 3)
    assert a.shape == (3, toyvideo.FRAMES, toyvideo.SIZE, toyvideo.SIZE, 3)
    assert np.array_equal(a, b) and ca == cb
    assert not np.array_equal(a, c)


def reference_clip(row: np.ndarray, frames: int = toyvideo.FRAMES, size: int = toyvideo.SIZE):
    """One clip drawn pixel by pixel, frame by frame, in numpy (float32 like render_batch)."""
    colour, shape, direction, background, texture = (int(v) for v in row[:5])
    radius, travel, x0, y0 = row[5:9]
    period, phase = int(row[9]), int(row[10])
    yy, xx = np.mgrid[0:size, 0:size]
    half = period // 2
    if toyvideo.TEXTURES[texture] == "stripes":
        on = ((xx + yy + phase) // half) % 2 == 0
    else:
        on = (((xx + phase) // half) + ((yy + phase) // half)) % 2 == 0
    palette = np.asarray(list(toyvideo.COLOURS.values()), np.float32)
    bg = np.full((size, size, 3), toyvideo.BASE_LEVEL, np.float32)
    bg[on] = toyvideo.BACKGROUND_LEVEL * palette[background] + toyvideo.BASE_LEVEL
    dx, dy = list(toyvideo.DIRECTIONS.values())[direction]
    clip = np.empty((frames, size, size, 3), np.float32)
    masks = np.empty((frames, size, size), bool)
    for f in range(frames):
        t = f / (frames - 1)
        cx, cy = np.float32(x0 + dx * travel * t), np.float32(y0 + dy * travel * t)
        masks[f] = toyvideo.shape_mask(toyvideo.SHAPES[shape], (xx + 0.5).astype(np.float32) - cx,
                                       (yy + 0.5).astype(np.float32) - cy, np.float32(radius))
        clip[f] = bg
        clip[f][masks[f]] = palette[colour]
    return clip, masks


def test_vectorised_renderer_equals_drawing_clip_by_clip():
    rows, combos = toyvideo.ToyVideo(0).draw(0, 24)
    assert {c.shape for c in combos} == set(toyvideo.SHAPES)
    assert {c.direction for c in combos} == set(toyvideo.DIRECTIONS)
    assert {c.texture for c in combos} == set(toyvideo.TEXTURES)
    clips, masks = toyvideo.render_batch(torch.from_numpy(rows))
    for i, row in enumerate(rows):
        clip, mask = reference_clip(row)
        assert np.array_equal(clips[i].numpy(), clip) and np.array_equal(masks[i].numpy(), mask)
        # The shape is large enough for the check (>= 1% of the frame) on every frame.
        assert mask.reshape(len(mask), -1).mean(axis=1).min() > 0.04
    captions = [c.caption for c in combos]
    assert toyvideo.caption_ids(torch.from_numpy(rows)).tolist() == [toyvideo.tokenize(c) for c in captions]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_renderer_on_the_gpu_equals_the_cpu():
    rows, _ = toyvideo.ToyVideo(1).draw(3, 64)
    cpu = toyvideo.render_batch(torch.from_numpy(rows))
    gpu = toyvideo.render_batch(torch.from_numpy(rows).cuda())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True))
    assert torch.equal(toyvideo.caption_ids(torch.from_numpy(rows)),
                       toyvideo.caption_ids(torch.from_numpy(rows).cuda()).cpu())


def test_shape_loss_weight_maps_pixels_to_latent_elements_exactly():
    vae = toywan.PatchifyVAE()
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 17, 64, 64, generator=g) < 0.1
    shape = on_shape(vae, mask)
    # Each latent element is marked exactly when the pixel it holds is.
    where = vae.encode(torch.arange(mask.numel(), dtype=torch.float64).view(2, 1, 17, 64, 64)
                       .expand(-1, 3, -1, -1, -1))
    assert torch.equal(shape, mask.flatten()[where.long()])
    # So the weighted latent loss is the weighted pixel loss (frame 0 fills 4 latent frames).
    a, b = torch.rand(2, 2, 3, 17, 64, 64, generator=g, dtype=torch.float64)
    latent = ((1 + 10 * shape) * (vae.encode(a) - vae.encode(b)) ** 2).sum()
    copies = torch.ones(17, dtype=torch.float64)
    copies[0] = 4
    pixel = ((1 + 10 * mask).unsqueeze(1) * (a - b) ** 2 * copies.view(1, 1, 17, 1, 1)).sum()
    torch.testing.assert_close(latent, pixel, rtol=1e-12, atol=0)


def test_caption_embedding_tells_shape_colour_from_background_colour():
    torch.manual_seed(0)
    text = toywan.CaptionEmbedding()
    a = text(text.ids(["a red disk drifting right over blue stripes"]))
    b = text(text.ids(["a blue disk drifting right over red stripes"]))
    # Even a head that attends to every word alike (the sum of the rows) tells them apart.
    assert (a.sum(dim=1) - b.sum(dim=1)).abs().max() > 0.1


def test_held_out_captions_are_never_trained_on_and_cover_colours_and_directions():
    train_set, held = toyvideo.split()
    assert not set(train_set) & set(held)
    captions = toyvideo.held_out_captions(20)
    combos = [toyvideo.parse_caption(c) for c in captions]
    assert {c.colour for c in combos} == set(toyvideo.COLOURS)
    assert {c.direction for c in combos} == set(toyvideo.DIRECTIONS)
    assert all(c.colour != c.background for c in combos)


def test_tokenize_maps_words_and_unknowns():
    ids = toyvideo.tokenize("a red disk drifting right over blue stripes")
    assert [toyvideo.VOCAB[i] for i in ids] == "a red disk drifting right over blue stripes".split()
    assert toyvideo.tokenize("a purple fox")[:3] == [2, 1, 1]
    assert toyvideo.tokenize("")[0] == 0


def test_parse_caption_refuses_other_text():
    with pytest.raises(UserError, match="not a toyvideo caption"):
        toyvideo.parse_caption("a red fox trots through snow")
    with pytest.raises(UserError, match="same shape and background colour"):
        toyvideo.parse_caption("a red disk drifting left over red stripes")


def test_check_passes_ground_truth_and_fails_wrong_direction_colour_and_noise():
    rng = np.random.default_rng(0)
    for combo in toyvideo.split()[1][:12]:
        clip = uint8(toyvideo.render(combo, rng))
        assert check_clip(clip, combo.caption).passed, combo.caption
        # The same clip played backwards moves the opposite way.
        backwards = check_clip(clip[::-1].copy(), combo.caption)
        assert backwards.colour_ok and not backwards.direction_ok, combo.caption
        # A caption naming another colour (not the background's) finds no such shape.
        other = next(c for c in toyvideo.COLOURS if c not in (combo.colour, combo.background))
        assert not check_clip(clip, combo.caption.replace(combo.colour, other, 1)).colour_ok
    noise = rng.integers(0, 256, size=(17, 64, 64, 3), dtype=np.uint8)
    assert not check_clip(noise, toyvideo.held_out_captions(1)[0]).passed


def test_patchify_vae_is_exact_and_keeps_wan_layout():
    vae = toywan.PatchifyVAE()
    x = torch.rand(2, 3, 17, 64, 64) * 2 - 1
    z = vae.encode(x)
    assert z.shape == (2, vae.config.z_dim, 5, 16, 16)
    assert torch.equal(vae.decode(z, return_dict=False)[0], x)


def test_toywan_runs_through_wan_pipeline_and_padding_is_zero():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    config = dict(transformer=toywan.transformer_config(layers=1), vae={}, shift=3.0, prediction="x0")
    pipe, text = toywan.build_pipeline(config)
    assert type(pipe).__name__ == "WanPipeline"
    assert isinstance(pipe.transformer, WanTransformer3DModel)
    model = toywan.as_loaded(pipe, text, torch.device("cpu"), torch.float32, random_weights=True)
    settings = model.defaults.__class__(steps=2, frames=5, height=32, width=32)
    frames = model.generate("a red disk drifting right over blue stripes", 0, settings)
    assert frames.shape == (5, 32, 32, 3) and frames.dtype == np.uint8
    assert torch.count_nonzero(text.encode("")) == 0
    assert torch.count_nonzero(text.encode("a red disk")[0, 3:]) == 0


def test_check_model_keeps_its_clips_for_a_strip(tmp_path):
    from PIL import Image

    torch.manual_seed(0)
    config = dict(transformer=toywan.transformer_config(layers=1), vae={}, shift=3.0, prediction="x0")
    model = toywan.as_loaded(*toywan.build_pipeline(config), torch.device("cpu"), torch.float32,
                             random_weights=True)
    model.defaults = model.defaults.__class__(steps=2, frames=9, height=32, width=32)
    clips: list = []
    result = check_model(model, toyvideo.held_out_captions(2), clips=clips)
    assert result["n"] == 2 and [c.shape for c in clips] == [(9, 32, 32, 3)] * 2
    write_strip(tmp_path / "s.png", clips, every=4, scale=2)
    assert Image.open(tmp_path / "s.png").size == (3 * 32 * 2, 2 * 32 * 2)


def test_train_is_deterministic_and_writes_a_loadable_model(tmp_path):
    runs = [train(tmp_path / name, steps=3, batch=2, layers=1, log_every=1, check=False)
            for name in ("a", "b")]
    assert runs[0]["training"]["final_loss"] == runs[1]["training"]["final_loss"]
    config, tensors = toywan.read(tmp_path / "a" / "toywan.safetensors")
    _, again = toywan.read(tmp_path / "b" / "toywan.safetensors")
    assert all(torch.equal(tensors[k], again[k]) for k in tensors)
    assert config["training"]["steps"] == 3 and config["transformer"]["attention_head_dim"] == 128
    assert all(v.dtype == torch.bfloat16 for v in tensors.values())
    for name in ("card.md", "loss.png", "loss.csv"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    model = toywan.load_toywan(torch.device("cpu"), torch.float32, tmp_path / "a" / "toywan.safetensors")
    assert not model.random_weights and model.extra["trained"]["steps"] == 3


def test_x_prediction_returns_the_velocity_of_its_clean_estimate():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    net = toywan.XPredWanTransformer(**toywan.transformer_config(layers=1)).eval()
    xt = torch.randn(2, net.config.in_channels, 2, 4, 4)
    t = torch.tensor([700.0, 20.0])  # the second below SIGMA_MIN * 1000: clamped
    text = torch.randn(2, 3, toywan.TEXT_DIM)
    with torch.no_grad():
        v = net(xt, t, text, return_dict=False)[0]
        x0 = WanTransformer3DModel.forward(net, xt, t, text, return_dict=False)[0]
    sigma = torch.tensor([0.7, toywan.SIGMA_MIN]).view(-1, 1, 1, 1, 1)
    torch.testing.assert_close(xt - sigma * v, x0, rtol=1e-4, atol=1e-5)


def test_full_size_weights_fit_in_two_megabytes():
    pipe, text = toywan.build_pipeline(dict(transformer=toywan.transformer_config(), vae={}, shift=3.0,
                                            positions=True))
    assert isinstance(pipe.transformer.patch_embedding, toywan.PositionedPatchEmbedding)
    size = sum(v.numel() * 2 for v in toywan.state_dict(pipe.transformer, text).values())
    assert size <= 2_000_000


def test_cli_bad_input_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check-tiny", "--weights", str(tmp_path / "missing.safetensors")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: ")
    with pytest.raises(SystemExit) as e:
        main(["train-tiny", "--out", str(tmp_path / "t"), "--steps", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: ") and "\n" not in err


def test_centroids_are_fractions_of_the_side():
    w = torch.zeros(1, 2, 8, 8)
    w[0, 0, 1, 2] = 1  # row 1, column 2
    w[0, 1, 5:7, 6] = 2
    c = centroids(w, eps=0.0)
    torch.testing.assert_close(c[0, 0], torch.tensor([2.5 / 8, 1.5 / 8]))
    torch.testing.assert_close(c[0, 1], torch.tensor([6.5 / 8, 6.0 / 8]))


def test_motion_loss_is_small_on_the_clip_and_large_on_the_clip_played_backwards():
    vae = toywan.PatchifyVAE()
    rows, _ = toyvideo.ToyVideo(3).draw(0, 4)
    rows = torch.from_numpy(rows)
    clips, mask = toyvideo.render_batch(rows)
    x0 = (vae.encode(clips.permute(0, 4, 1, 2, 3) * 2 - 1) - toywan.PIXEL_MEAN) / toywan.PIXEL_STD
    colour = torch.tensor(list(toyvideo.COLOURS.values()))[rows[:, 0].long()]
    true = centroids(mask.float(), eps=0.0)
    here = motion_loss(vae, x0, colour, true)
    backwards = vae.encode(clips.flip(1).permute(0, 4, 1, 2, 3) * 2 - 1)
    there = motion_loss(vae, (backwards - toywan.PIXEL_MEAN) / toywan.PIXEL_STD, colour, true)
    assert here.max() < 1e-4  # clips travel 0.38-0.50 of the side
    assert there.min() > 0.01
    x0.requires_grad_(True)
    motion_loss(vae, x0 + 0.3 * torch.randn_like(x0), colour, true).sum().backward()
    assert x0.grad.abs().sum() > 0


def test_train_fine_tunes_from_weights_and_compiles_only_when_asked(tmp_path):
    first = train(tmp_path / "a", steps=2, batch=2, layers=1, log_every=1, check=False, positions=False)
    assert first["training"]["compile"] is False  # the default on CPU
    assert first["training"]["motion_weight"] > 0
    again = train(tmp_path / "b", steps=2, batch=2, layers=1, log_every=1, check=False,
                  init=tmp_path / "a" / "toywan.safetensors", motion_weight=0.0)
    assert again["training"]["init"].endswith("toywan.safetensors")
    # The positions a RoPE-only model lacks start at zero; the rest is the model it started from.
    config, tensors = toywan.read(tmp_path / "b" / "toywan.safetensors")
    assert config["positions"] and "transformer.patch_embedding.pos_t" in tensors
    assert "motion" in (tmp_path / "b" / "loss.csv").read_text().splitlines()[0]
    with pytest.raises(UserError):
        train(tmp_path / "c", steps=1, batch=2, layers=2, check=False,
              init=tmp_path / "a" / "toywan.safetensors")


def test_position_term_starts_at_zero_and_tells_frames_apart():
    conv = torch.nn.Conv3d(4, 8, (1, 2, 2), stride=(1, 2, 2))
    pos = toywan.PositionedPatchEmbedding.wrap(conv)
    assert {"weight", "bias"} <= set(pos.state_dict())  # Wan's names: weights load either way
    x = torch.randn(1, 4, 3, 4, 4)
    torch.testing.assert_close(pos(x), conv(x))
    with torch.no_grad():
        pos.pos_t[:, 1] = 1.0
    same = torch.zeros(1, 4, 3, 4, 4)  # every frame alike: only the position term differs
    y = pos(same)
    assert torch.equal(y[:, :, 0], y[:, :, 2]) and not torch.equal(y[:, :, 0], y[:, :, 1])
    with pytest.raises(UserError):
        pos(torch.randn(1, 4, 9, 4, 4))


def test_new_models_draw_their_position_term_and_fine_tunes_start_it_at_zero():
    # Zero-initialised, the term stayed buried under the embedded noise and the direction word
    # was never learned (docs/perf/log.md, ToyWan run 5); a fine-tune adds it at zero instead.
    config = dict(transformer=toywan.transformer_config(layers=1), vae={}, shift=3.0,
                  prediction="x0", positions=True)
    torch.manual_seed(0)
    pipe, text = toywan.build_pipeline(config)
    new = pipe.transformer.patch_embedding
    stds = [float(p.detach().std()) for p in (new.pos_t, new.pos_h, new.pos_w)]
    assert all(0.25 < s < 0.35 for s in stds), stds
    tensors = {f"transformer.{k}": v for k, v in pipe.transformer.state_dict().items()
               if not k.startswith("patch_embedding.pos_")}
    tensors.update({f"text.{k}": v for k, v in text.state_dict().items()})
    tuned, _ = toywan.build_pipeline(config, tensors, new_positions=True)
    assert all(not p.any() for p in (tuned.transformer.patch_embedding.pos_t,
                                      tuned.transformer.patch_embedding.pos_h))


def test_high_noise_share_lands_in_its_band_and_leaves_the_default_stream_alone():
    shift = 3.0
    g = torch.Generator().manual_seed(5)
    plain = draw_sigmas(g, 20000, shift)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(5)).double()
    assert torch.equal(plain, shift * u / (1 + (shift - 1) * u))  # the sampler's warped uniform
    lo, hi = HIGH_NOISE_BAND
    everything = draw_sigmas(torch.Generator().manual_seed(5), 20000, shift, high_noise=1.0)
    assert everything.min() >= lo and everything.max() <= hi
    assert abs(float(everything.mean()) - (lo + hi) / 2) < 0.001  # uniform in the band
    quarter = draw_sigmas(torch.Generator().manual_seed(5), 20000, shift, high_noise=0.25)
    in_band = lambda s: float(((s >= lo) & (s <= hi)).double().mean())  # noqa: E731
    # a quarter redrawn into the band, the rest keeps the warped share already there
    expected = 0.25 + 0.75 * in_band(plain)
    assert abs(in_band(quarter) - expected) < 0.015
    floored = draw_sigmas(torch.Generator().manual_seed(5), 100, shift, sigma_floor=0.9)
    assert torch.allclose(floored, 0.9 + 0.1 * plain[:100])
    with pytest.raises(UserError, match="high-noise"):
        train(Path("/nonexistent/never-written"), steps=1, high_noise=1.5)


def test_position_std_sets_a_new_model_s_position_term():
    config = dict(transformer=toywan.transformer_config(layers=1), vae={}, shift=3.0,
                  prediction="x0", positions=True)
    torch.manual_seed(0)
    pipe, _ = toywan.build_pipeline(config, position_std=0.6)
    emb = pipe.transformer.patch_embedding
    stds = [float(p.detach().std()) for p in (emb.pos_t, emb.pos_h, emb.pos_w)]
    assert all(0.5 < s < 0.7 for s in stds), stds


@pytest.fixture(scope="module")
def packaged():
    from vcbench.pipelines.registry import load_model

    return load_model("tiny-wan", device="cpu")


def test_tiny_wan_is_the_packaged_trained_model(packaged):
    config, _ = toywan.read()
    assert packaged.name == "tiny-wan" and not packaged.random_weights
    assert packaged.extra["weights"] == "toywan.safetensors"
    assert config["positions"] and config["training"]["steps"] > 1000
    assert toywan.WEIGHTS.stat().st_size <= 2 * 1024 * 1024
    d = packaged.defaults
    assert (d.frames, d.height, d.width) == (toyvideo.FRAMES, toyvideo.SIZE, toyvideo.SIZE)


@pytest.mark.parametrize("caption", ["a red disk drifting right over blue stripes",
                                     "a red disk drifting left over blue stripes",
                                     "a yellow square drifting up over green checker"])
def test_packaged_weights_follow_a_held_out_caption_and_its_direction_word(packaged, caption):
    # Held-out combinations (never trained on), the first two differing only in the direction
    # word: the named colour must be in the frame and move the named way.
    assert caption in toyvideo.held_out_captions(24)
    frames = packaged.generate(caption, 7, packaged.defaults)
    result = check_clip(frames, caption)
    assert result.colour_ok and result.direction_ok, result


def test_check_run_folder_goes_into_the_report_and_strict_fails_untrained_weights(tmp_path, capsys):
    from vcbench.report.assemble import build_report

    result = train(tmp_path / "w", steps=1, batch=1, layers=1, log_every=1)  # with its check
    weights = tmp_path / "w" / "toywan.safetensors"
    err = capsys.readouterr().err  # an untrained model: the trainer warns, and keeps the weights
    assert result["check"]["trained"]["score"] < 0.7 and weights.is_file()
    assert err.count("\n") == 1 and err.startswith("warning: these weights pass the caption check")
    with pytest.raises(SystemExit) as e:
        main(["check-tiny", "--weights", str(weights), "--strict", "--out", str(tmp_path / "check")])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and err.startswith("error: the caption check passed")
    run = tmp_path / "check"
    rows = (run / "check.csv").read_text().splitlines()
    assert len(rows) == 21 and rows[0] == "caption,colour_ok,direction_ok,dx,dy,passed"
    assert json.loads((run / "manifest.json").read_text())["status"] == "ok"
    passed = sum(row.endswith(",True") for row in rows[1:]) / 20
    report = build_report([run], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Caption check" in md and f"Passed {passed:.2f} of 20 captions" in md
    assert "**below the bar**" in md and (tmp_path / "report" / "caption_check_strip.png").is_file()
    assert (tmp_path / "report" / "caption_check.csv") in report.files
