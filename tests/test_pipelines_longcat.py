"""LongCat-Video: the adapter over the upstream package, and the patch's routing of attention
modules that do not end in SDPA (`patch.SDPA_CORES`).

The end-to-end test needs the upstream package (`longcat_video`, not on PyPI) and an attention
backend its modules can run (xformers, or flash-attn on CUDA); it skips otherwise. It builds a
tiny random-weight checkpoint folder in upstream's layout and loads it through `--model-path`."""

import importlib.util

import numpy as np
import pytest
import torch

import vcbench
from vcbench.errors import UserError
from vcbench.pipelines import patch as patch_module
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model

# -- the core-pinning mechanism, on a module of this test's own -----------------------------


class CoreAttention(torch.nn.Module):
    """Self-attention whose core is a hand-written softmax (no SDPA), like a flash-attn call."""

    def __init__(self, dim=256, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def _process_attn(self, q, k, v, shape):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v

    def forward(self, x, shape=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(self._process_attn(q, k, v, shape).transpose(1, 2).reshape(b, n, c))


class TinyDit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([CoreAttention(), CoreAttention()])

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = hidden_states + block(hidden_states)
        return hidden_states


class PlainPipeline:  # no diffusers `components`: the denoiser is found as `dit`
    def __init__(self):
        torch.manual_seed(0)
        self.dit = TinyDit()
        self.scheduler = None


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(patch_module.SDPA_CORES, (__name__, "CoreAttention"), "_process_attn")


def test_a_registered_attention_core_is_routed_through_sdpa_and_restored(registered):
    pipe = PlainPipeline()
    x = torch.randn(1, 64, 256, generator=torch.Generator().manual_seed(1))
    reference = pipe.dit(x)
    with vcbench.patch(pipe, "bf16") as p:
        assert all("_process_attn" in b.__dict__ for b in pipe.dit.blocks)
        bf16 = pipe.dit(x)
    assert dict(p.routed) == {"dit.blocks.0": 1, "dit.blocks.1": 1}
    torch.testing.assert_close(bf16, reference, atol=2e-3, rtol=2e-3)
    with vcbench.patch(pipe, "fp8-fa4") as q:
        fp8 = pipe.dit(x)
    assert sum(q.routed.values()) == 2 and not torch.equal(fp8, reference)
    # Restored: the class's own method again, and the very same output.
    assert all("_process_attn" not in b.__dict__ for b in pipe.dit.blocks)
    assert torch.equal(pipe.dit(x), reference)


def test_route_cross_is_refused_for_core_modules(registered):
    pipe = PlainPipeline()
    with pytest.raises(UserError, match="route_cross"):
        vcbench.patch(pipe, "bf16", route_cross=True)
    assert all("_process_attn" not in b.__dict__ for b in pipe.dit.blocks)


def test_unregistered_modules_are_not_touched():
    pipe = PlainPipeline()
    with vcbench.patch(pipe, "bf16") as p:
        pipe.dit(torch.randn(1, 8, 256))
    assert not p.routed and all("_process_attn" not in b.__dict__ for b in pipe.dit.blocks)


# -- the upstream package, when installed ----------------------------------------------------


def _backend():
    if importlib.util.find_spec("longcat_video") is None:
        pytest.skip("upstream LongCat-Video package (longcat_video) not importable")
    if importlib.util.find_spec("xformers") is not None:
        return {"enable_xformers": True}
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return {"enable_flashattn2": True}
    pytest.skip("longcat_video's attention needs xformers or flash-attn")


def _save_tiny_longcat(path, backend):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler
    from longcat_video.modules.longcat_video_dit import LongCatVideoTransformer3DModel
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{chr(97 + i): 3 + i for i in range(26)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path / "tokenizer")
    torch.manual_seed(0)
    UMT5EncoderModel(UMT5Config(vocab_size=len(vocab), d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                num_heads=2)).save_pretrained(path / "text_encoder")
    AutoencoderKLWan(base_dim=16, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     latents_mean=[0.0] * 4, latents_std=[1.0] * 4).save_pretrained(path / "vae")
    FlowMatchEulerDiscreteScheduler(shift=7.0).save_pretrained(path / "scheduler")
    LongCatVideoTransformer3DModel(in_channels=4, out_channels=4, hidden_size=256, depth=2, num_heads=2,
                                   caption_channels=32, mlp_ratio=1, adaln_tembed_dim=32,
                                   frequency_embedding_size=32, **backend).save_pretrained(path / "dit")
    return path


def test_longcat_full_pipeline_from_a_local_folder(tmp_path):
    backend = _backend()
    model = load_model("longcat-video", _save_tiny_longcat(tmp_path, backend), "cpu")
    assert model.defaults == ClipSettings(steps=50, frames=93, height=480, width=832)
    small = ClipSettings(steps=3, frames=5, height=64, width=64)
    reference = model.generate("a cat", 0, small)
    assert reference.shape == (5, 64, 64, 3) and reference.dtype == np.uint8
    with vcbench.patch(model.pipe, "vc-8bit") as p:
        vc = model.generate("a cat", 0, small)
    # Self-attention of both blocks, once per step (CFG halves in one batch); cross-attention
    # (packed variable-length text) is upstream's own and not counted.
    assert dict(p.routed) == {"dit.blocks.0.attn": 3, "dit.blocks.1.attn": 3} and not p.plain
    assert p.actions == {0: "regroup", 1: "plain", 2: "plain"} and p.state.grid == (2, 4, 4)
    assert not np.array_equal(vc, reference)
    assert np.array_equal(model.generate("a cat", 0, small), reference)  # restored
    with pytest.raises(UserError, match="4n\\+1 frames"):
        model.generate("a cat", 0, ClipSettings(steps=3, frames=6, height=64, width=64))


def test_longcat_folder_without_its_subfolders_is_one_error(tmp_path):
    if importlib.util.find_spec("longcat_video") is None:
        pytest.skip("upstream LongCat-Video package (longcat_video) not importable")
    (tmp_path / "dit").mkdir()
    with pytest.raises(UserError, match="missing tokenizer/, text_encoder/, vae/, scheduler/"):
        load_model("longcat-video", tmp_path, "cpu")


def test_longcat_without_upstream_package_is_one_error_line(tmp_path, capsys):
    if importlib.util.find_spec("longcat_video") is not None:
        pytest.skip("the upstream package is installed here")
    from vcbench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", "longcat-video", "--model-path", str(tmp_path), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: longcat-video needs the upstream LongCat-Video package")

