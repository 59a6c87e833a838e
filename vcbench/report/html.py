"""report.html: the generate runs' clips to watch side by side, with report.md's tables and figures.

    OUT/report.html                         one page; its CSS and script inline, nothing fetched
    OUT/clips/<model>/<prompt>_s<seed>/
        <method>.webm                       the clip, VP9 in WebM at its own size
        <method>.diff.webm                  |clip - reference| per pixel as a heatmap (DIFF_SCALE)

Per (model, prompt, seed) one row: the reference (bf16) clip first, then each method's clip with
its difference clip beside it and that clip's PSNR/SSIM/LPIPS under both (score.json's row, or
"not scored"). One control bar plays, pauses and scrubs every clip on the page together: the
page keeps one clock and seeks any clip that drifts a frame from it.

Clips up to LOSSLESS_MAX_PIXELS (frames x height x width) are encoded losslessly (VP9 in RGB:
the page shows the exact pixels that were scored); larger ones lossy (VP9 4:2:0, CRF 30), and
the page says which. Without PyAV (or its libvpx), each clip becomes one PNG holding every frame
side by side, which the page's script steps through like a video: same sync, no codec needed.
The page links each clip's own files in its run folder (frames/, preview.mp4) by paths relative
to OUT, so the report folder moves with the results tree that holds it; the page itself, its
clips and figures live inside OUT and move with it alone.
"""

from __future__ import annotations

import html
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vcbench.pipelines.video_io import PREVIEW_FPS
from vcbench.report import tables
from vcbench.report.load import GenerateRun, Runs
from vcbench.runs import atomic_write_bytes, atomic_write_text

LOSSLESS_MAX_PIXELS = 256 * 256 * 128
CLIP_METRICS = {"psnr": "PSNR", "ssim": "SSIM", "lpips": "LPIPS"}
UNITS = {"psnr": " dB"}
# The difference clip: each pixel's largest channel error d = max_c |cand - ref| (0..255), shown
# as the inferno colour of sqrt(d / 255). Fixed for every clip and method, so colours compare
# across the page; the square root spreads the small errors of 8-bit methods (d = 4 is already
# an eighth of the scale) without saturating the large ones.
DIFF_SCALE = "inferno colour of sqrt(d / 255), d = max over R, G, B of |clip - reference| (0 to 255)"
DIFF_TICKS = (0, 1, 4, 16, 64, 255)
ZOOMS = (0.25, 0.5, 1, 2, 3, 4)


def diff_lut() -> np.ndarray:
    """(256, 3) uint8: the colour of each difference value d."""
    from matplotlib import colormaps

    rgba = colormaps["inferno"](np.sqrt(np.arange(256) / 255.0))
    return np.round(rgba[:, :3] * 255).astype(np.uint8)


def difference(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """The heatmap frames (T, H, W, 3) uint8 of two uint8 clips of one shape."""
    d = np.abs(cand.astype(np.int16) - ref.astype(np.int16)).max(axis=-1)
    return diff_lut()[d]


@dataclass
class Entry:
    name: str  # method, with its variant
    method: str
    run: GenerateRun
    clip: dict
    score: dict | None  # this clip's score.json row


@dataclass
class Group:
    model: str
    prompt_id: str
    seed: int
    prompt: str
    entries: list[Entry] = field(default_factory=list)

    @property
    def reference(self) -> Entry | None:
        return next((e for e in self.entries if e.method == tables.REFERENCE), None)


def groups(runs: Runs) -> list[Group]:
    """One group per (model, prompt, seed), its entries the reference first, then the methods in
    their usual order; a method and variant met in two runs is taken from the first."""
    by_key: dict[tuple, Group] = {}
    for run in runs.generate:
        rows = {(r.get("method"), r.get("prompt_id"), r.get("seed")): r
                for r in (run.score or {}).get("rows", [])}
        for c in run.clips():
            if c.get("status") != "ok" or not c.get("frames_dir"):
                continue
            key = (run.model, c["prompt_id"], c["seed"])
            group = by_key.setdefault(key, Group(*key, c.get("prompt", "")))
            name = tables.label(c["method"], tables.variant(run, c["method"]))
            if all(e.name != name for e in group.entries):
                group.entries.append(Entry(name, c["method"], run, c,
                                           rows.get((c["method"], c["prompt_id"], c["seed"]))))
    for group in by_key.values():
        group.entries.sort(key=lambda e: (e.method != tables.REFERENCE,
                                          tables.method_order(e.method), e.name))
    return list(by_key.values())


# --- clip files ------------------------------------------------------------------------------

def can_encode_webm() -> bool:
    try:
        import av

        av.codec.Codec("libvpx-vp9", "w")
    except Exception:  # no PyAV, or a build without libvpx
        return False
    return True


def encode_webm(frames: np.ndarray, fps: int = PREVIEW_FPS) -> tuple[bytes, str]:
    """(the WebM file, how it was encoded) of uint8 (T, H, W, 3) frames."""
    import av

    t, h, w = frames.shape[:3]
    lossless = t * h * w <= LOSSLESS_MAX_PIXELS
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="webm") as container:
        stream = container.add_stream("libvpx-vp9", rate=fps)
        if lossless:  # planar RGB: no colour conversion, the decoded pixels are the frames
            stream.width, stream.height, stream.pix_fmt = w, h, "gbrp"
            stream.options = {"lossless": "1", "deadline": "realtime", "cpu-used": "8"}
        else:  # 4:2:0 needs even sides: pad by one edge pixel rather than fail
            stream.width, stream.height, stream.pix_fmt = w + w % 2, h + h % 2, "yuv420p"
            stream.options = {"crf": "30", "b": "0", "deadline": "realtime", "cpu-used": "8",
                              "row-mt": "1"}
            frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        for frame in frames:
            image = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            container.mux(stream.encode(image))
        container.mux(stream.encode())
    return buf.getvalue(), "lossless VP9" if lossless else "lossy VP9 (CRF 30, 4:2:0)"


def encode_strip(frames: np.ndarray) -> bytes:
    """Every frame side by side in one PNG (lossless), for the page to step through."""
    from PIL import Image

    t, h, w, _ = frames.shape
    strip = frames.transpose(1, 0, 2, 3).reshape(h, t * w, 3)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(strip)).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Media:
    src: str  # relative to the report folder
    kind: str  # "video" or "strip"
    frames: int
    height: int
    width: int
    encoding: str


def write_media(frames: np.ndarray, path: Path, out: Path, webm: bool) -> Media:
    """`path` without suffix; .webm (or .png for a strip) is added."""
    t, h, w = frames.shape[:3]
    if webm:
        data, how = encode_webm(frames)
        path, kind = path.with_name(path.name + ".webm"), "video"
    else:
        data, how = encode_strip(frames), "PNG frames (no PyAV with libvpx: stepped by the page)"
        path, kind = path.with_name(path.name + ".png"), "strip"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    return Media(path.relative_to(out).as_posix(), kind, t, h, w, how)


# --- the page --------------------------------------------------------------------------------

def write_html(runs: Runs, out: Path, md: str, heading: str) -> tuple[Path, list[Path]]:
    """Writes report.html and its clip files; returns (report.html, the clip files)."""
    from vcbench.clips import read_clip

    webm = can_encode_webm()
    written: list[Path] = []
    sections, widths = [], []
    for group in groups(runs):
        folder = out / "clips" / _slug(group.model) / f"{_slug(group.prompt_id)}_s{group.seed}"
        ref = group.reference
        ref_frames = _uint8_rgb(read_clip(ref.run.path / ref.clip["frames_dir"]).frames) \
            if ref else None
        cards = []
        for entry in group.entries:
            frames = _uint8_rgb(read_clip(entry.run.path / entry.clip["frames_dir"]).frames)
            clip = write_media(frames, folder / _slug(entry.name), out, webm)
            written.append(out / clip.src)
            widths.append(clip.width)
            diff, why_none = None, ""
            if entry is ref:
                pass
            elif ref_frames is None:
                why_none = f"no {tables.REFERENCE} clip of this prompt and seed"
            elif ref_frames.shape != frames.shape:
                why_none = f"shape {frames.shape} differs from {tables.REFERENCE}'s {ref_frames.shape}"
            else:
                diff = write_media(difference(ref_frames, frames),
                                   folder / f"{_slug(entry.name)}.diff", out, webm)
                written.append(out / diff.src)
            cards.append(_card(entry, clip, diff, why_none, out))
        sections.append(_group_section(group, cards))
    body = markdown_to_html(md, skip_title=True)
    page = _page(heading, sections, body, _default_zoom(widths), webm)
    atomic_write_text(out / "report.html", page)
    return out / "report.html", written


def _uint8_rgb(frames: np.ndarray) -> np.ndarray:
    """A clip as the page shows it: uint8 RGB (grey repeated; a float clip, which holds
    NaN/inf, as its PNG frames would: clipped and rounded, NaN as 0)."""
    if frames.dtype != np.uint8:
        frames = np.round(np.clip(np.nan_to_num(frames, nan=0.0), 0, 255)).astype(np.uint8)
    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, axis=-1)
    return frames[..., :3]


def _default_zoom(widths: list[int]) -> float:
    """The largest zoom that keeps the widest clip within 160 px on screen (64 px clips: 2x),
    so four methods with their difference clips fit a laptop's width; the page can zoom."""
    widest = max(widths, default=160)
    fitting = [z for z in ZOOMS if widest * z <= 160]
    return max(fitting) if fitting else ZOOMS[0]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "_"


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _player(media: Media, role: str) -> str:
    size = (f'data-frames="{media.frames}" style="--w:{media.width};--h:{media.height};'
            f'--frames:{media.frames}')
    if media.kind == "video":
        return (f'<video class="player" data-role="{role}" {size}" src="{_e(media.src)}" muted '
                f'loop playsinline preload="auto" title="{_e(media.encoding)}"></video>')
    return (f'<div class="player strip" data-role="{role}" {size};background-image:'
            f'url(&quot;{_e(media.src)}&quot;)" role="img" title="{_e(media.encoding)}"></div>')


def _metrics(entry: Entry) -> str:
    if entry.method == tables.REFERENCE:
        return '<p class="metrics reference">reference: the other clips are scored against it</p>'
    row = entry.score
    if row is None:
        return '<p class="metrics unscored">not scored</p>'
    if row.get("error"):
        return f'<p class="metrics failed">score failed: {_e(row["error"])}</p>'
    if row.get("nonfinite_frames"):
        return (f'<p class="metrics failed">non-finite frames {_e(row["nonfinite_frames"])}: '
                "not scored</p>")
    cells = []
    for metric, name in CLIP_METRICS.items():
        value = tables.as_float(row.get(metric))
        lower = not tables.higher_is_better(metric)
        arrow = "lower is better" if lower else "higher is better"
        shown = "not scored" if metric not in row else (
            f"{value:.2f}{UNITS.get(metric, '')}" if metric == "psnr" and math.isfinite(value)
            else tables.fmt(value))
        cells.append(f'<tr data-metric="{metric}"><th title="{arrow}">{name} '
                     f'{"↓" if lower else "↑"}</th><td>{_e(shown)}</td></tr>')
    return f'<table class="metrics">{"".join(cells)}</table>'


def _card(entry: Entry, clip: Media, diff: Media | None, why_none: str, out: Path) -> str:
    is_ref = entry.method == tables.REFERENCE
    badge = '<span class="badge">reference</span>' if is_ref else ""
    media = [f'<figure class="clip">{_player(clip, "clip")}<figcaption>clip</figcaption></figure>']
    if diff is not None:
        media.append(f'<figure class="diff">{_player(diff, "diff")}'
                     f"<figcaption>|clip − {_e(tables.REFERENCE)}|</figcaption></figure>")
    elif why_none:
        media.append(f'<p class="nodiff">no difference clip: {_e(why_none)}</p>')
    links = [f'<a href="{_e(_rel(entry.run.path / entry.clip["frames_dir"], out))}">frames</a>']
    if entry.clip.get("mp4"):
        links.append(f'<a href="{_e(_rel(entry.run.path / entry.clip["mp4"], out))}">preview.mp4</a>')
    links.append(f'<a href="{_e(clip.src)}">{_e(Path(clip.src).suffix[1:])}</a>')
    return (f'<div class="card{" ref" if is_ref else ""}" data-method="{_e(entry.method)}" '
            f'data-name="{_e(entry.name)}"><div class="name">{_e(entry.name)} {badge}</div>'
            f'<div class="media">{"".join(media)}</div>{_metrics(entry)}'
            f'<div class="links">{" · ".join(links)}<span class="enc">{_e(clip.encoding)}</span>'
            "</div></div>")


def _rel(target: Path, out: Path) -> str:
    return Path(os.path.relpath(Path(target).resolve(), Path(out).resolve())).as_posix()


def _group_section(group: Group, cards: list[str]) -> str:
    return (f'<section class="group" data-model="{_e(group.model)}" '
            f'data-prompt="{_e(group.prompt_id)}" data-seed="{group.seed}">'
            f"<h3>{_e(group.model)} · prompt {_e(group.prompt_id)} · seed {group.seed}</h3>"
            f'<p class="prompt">{_e(group.prompt)}</p><div class="row">{"".join(cards)}</div>'
            "</section>")


def _legend() -> str:
    lut = diff_lut()
    stops = ", ".join(f"rgb({r},{g},{b}) {100 * math.sqrt(d / 255):.1f}%"
                      for d in range(0, 256, 5) for r, g, b in [lut[d]])
    ticks = "".join(f'<span style="left:{100 * math.sqrt(d / 255):.1f}%">{d}</span>'
                    for d in DIFF_TICKS)
    return (f'<div class="legend" title="{_e(DIFF_SCALE)}"><div class="bar" '
            f'style="background:linear-gradient(to right, {stops})"></div>'
            f'<div class="ticks">{ticks}</div><div class="caption">difference clips: '
            f"{_e(DIFF_SCALE)}</div></div>")


def _page(heading: str, sections: list[str], body: str, zoom: float, webm: bool) -> str:
    zooms = "".join(f'<option value="{z}"{" selected" if z == zoom else ""}>{z:g}x</option>'
                    for z in ZOOMS)
    clips = "".join(sections) or "<p>No generate runs with clips in this report.</p>"
    fallback = "" if webm else (
        '<p class="warn">PyAV with libvpx was not available when this report was written: each '
        "clip is a strip of PNG frames stepped by the page instead of a video.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(heading)}</title>
<link rel="icon" href="data:,">
<style>{CSS}</style></head>
<body style="--zoom:{zoom}" data-fps="{PREVIEW_FPS}">
<header><h1>{_e(heading)}</h1>
<p>Each row is one prompt and seed: the <b>{_e(tables.REFERENCE)}</b> clip (the reference) first,
then every method's clip with its difference from the reference beside it, and that clip's
scores under both. <a href="report.md">report.md</a> holds the same tables and figures as
<a href="#tables">below</a>.</p>{fallback}</header>
<nav id="controls">
<button id="play" type="button">Play all</button>
<button id="prev" type="button" title="previous frame">◀</button>
<button id="next" type="button" title="next frame">▶</button>
<label>frame <input id="frame" type="range" min="0" max="0" value="0" step="1"></label>
<output id="frame-label">0 / 0</output>
<label>speed <select id="rate"><option value="0.25">0.25x</option><option value="0.5">0.5x</option>
<option value="1" selected>1x</option></select></label>
<label>zoom <select id="zoom">{zooms}</select></label>
{_legend()}
</nav>
<main><section id="clips"><h2>Clips</h2>
<p class="note">{PREVIEW_FPS} frames per second. Scores: PSNR and SSIM higher is better, LPIPS
lower is better (from score.json; "not scored" where the run holds none). The difference clip
uses one fixed colour scale for every clip (bar above).</p>
{clips}</section>
<section id="tables"><h2>Tables and figures</h2>{body}</section></main>
<script>{SCRIPT}</script></body></html>
"""


CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d1d1f; background: #fafafa; }
header, main { padding: 0 16px; }
h1 { font-size: 22px; margin: 12px 0 4px; }
h2 { font-size: 18px; border-bottom: 1px solid #ddd; margin-top: 24px; }
h3 { font-size: 15px; margin: 16px 0 2px; }
.warn { background: #fff3cd; padding: 6px; }
#controls { position: sticky; top: 0; z-index: 2; display: flex; flex-wrap: wrap; gap: 10px;
  align-items: center; background: #fff; border-bottom: 1px solid #ccc; padding: 8px 16px; }
#controls button { min-width: 36px; padding: 3px 10px; }
#frame { width: 220px; vertical-align: middle; }
.legend { width: 300px; font-size: 11px; }
.legend .bar { height: 10px; border: 1px solid #999; }
.legend .ticks { position: relative; height: 13px; }
.legend .ticks span { position: absolute; transform: translateX(-50%); }
.legend .caption { color: #555; }
.prompt { margin: 0 0 6px; color: #444; font-style: italic; }
.row { display: flex; flex-wrap: nowrap; gap: 12px; overflow-x: auto; padding-bottom: 6px;
  align-items: flex-start; }
.card { flex: none; background: #fff; border: 1px solid #ddd; border-radius: 4px; padding: 6px; }
.card.ref { border: 2px solid #4878a8; }
.name { font-weight: 600; margin-bottom: 4px; }
.badge { background: #4878a8; color: #fff; font-size: 11px; border-radius: 3px; padding: 0 5px;
  font-weight: normal; }
.media { display: flex; gap: 6px; align-items: flex-start; }
figure { margin: 0; }
figcaption { font-size: 11px; color: #555; text-align: center; }
.player { display: block; image-rendering: pixelated; background-color: #000;
  width: calc(var(--zoom) * var(--w) * 1px); height: calc(var(--zoom) * var(--h) * 1px); }
.strip { background-repeat: no-repeat; background-size: calc(var(--frames) * 100%) 100%; }
.nodiff { width: 120px; font-size: 11px; color: #a00; }
table.metrics { border-collapse: collapse; margin-top: 4px; font-size: 12px; }
table.metrics th { text-align: left; font-weight: normal; color: #555; padding-right: 8px; }
.metrics.unscored, .metrics.reference, .metrics.failed { font-size: 12px; margin: 4px 0 0;
  max-width: 260px; }
.metrics.failed { color: #a00; }
.links { font-size: 11px; margin-top: 2px; }
.links .enc { color: #888; margin-left: 6px; }
#tables table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
#tables th, #tables td { border: 1px solid #ccc; padding: 2px 6px; }
#tables img { max-width: 100%; }
code { background: #eee; padding: 0 3px; }
"""

# One clock for the page: `t` seconds, advanced by the wall clock while playing. Videos play by
# themselves at the chosen speed and are seeked back only when they drift more than a frame;
# strips (no video codec) show the frame of `t`. Paused, every clip sits mid-frame on the
# slider's frame, so a frame index reads the same in every clip.
SCRIPT = """
(() => {
  const fps = Number(document.body.dataset.fps);
  const players = [...document.querySelectorAll('.player')];
  const frames = Math.max(1, ...players.map(p => Number(p.dataset.frames)));
  const slider = document.getElementById('frame'), label = document.getElementById('frame-label');
  const button = document.getElementById('play'), rate = document.getElementById('rate');
  slider.max = frames - 1;
  let playing = false, t = 0.5 / fps, last = 0;
  const length = p => Number(p.dataset.frames) / fps;
  const frameOf = (p, time) => Math.min(Number(p.dataset.frames) - 1,
                                        Math.floor((time % length(p)) * fps));
  function show(p, time, seek) {
    if (p.tagName === 'VIDEO') {
      const want = time % length(p);
      if (seek || Math.abs(p.currentTime - want) > 1 / fps) p.currentTime = want;
    } else {
      const n = Number(p.dataset.frames);
      p.style.backgroundPositionX = n > 1 ? (100 * frameOf(p, time) / (n - 1)) + '%' : '0%';
      p.dataset.frame = frameOf(p, time);
    }
  }
  function label_() {
    const f = Math.min(frames - 1, Math.floor((t % (frames / fps)) * fps));
    slider.value = f; label.textContent = f + ' / ' + (frames - 1);
  }
  function seekFrame(f) {
    pause();
    f = ((f % frames) + frames) % frames;
    t = (f + 0.5) / fps;
    players.forEach(p => show(p, t, true));
    label_();
  }
  function tick(now) {
    if (!playing) return;
    t = (t + (now - last) / 1000 * Number(rate.value)) % (frames / fps);
    last = now;
    players.forEach(p => show(p, t, false));
    label_();
    requestAnimationFrame(tick);
  }
  function play() {
    playing = true; button.textContent = 'Pause all';
    players.forEach(p => { if (p.tagName === 'VIDEO') {
      p.playbackRate = Number(rate.value); show(p, t, true); p.play().catch(() => {}); } });
    last = performance.now(); requestAnimationFrame(tick);
  }
  function pause() {
    playing = false; button.textContent = 'Play all';
    players.forEach(p => { if (p.tagName === 'VIDEO') p.pause(); });
  }
  button.addEventListener('click', () => playing ? pause() : play());
  slider.addEventListener('input', () => seekFrame(Number(slider.value)));
  document.getElementById('prev').addEventListener('click', () => seekFrame(Number(slider.value) - 1));
  document.getElementById('next').addEventListener('click', () => seekFrame(Number(slider.value) + 1));
  rate.addEventListener('change', () => players.forEach(p => {
    if (p.tagName === 'VIDEO') p.playbackRate = Number(rate.value); }));
  document.getElementById('zoom').addEventListener('change', e =>
    document.body.style.setProperty('--zoom', e.target.value));
  window.vcbenchSync = { seekFrame, play, pause, frameOf: p => frameOf(p, t) };
  seekFrame(0);
})();
"""


# --- report.md as HTML -----------------------------------------------------------------------

def markdown_to_html(md: str, skip_title: bool = False) -> str:
    """The Markdown report.md is written in: #-headings, paragraphs, '- ' lists, pipe tables,
    images, **bold**, `code` and <u>; nothing else is needed, so nothing else is parsed."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            if not (skip_title and level == 1):
                # report.md's ## is a section of this page's "Tables and figures" (its h2)
                tag = f"h{min(6, level + 1)}"
                out.append(f"<{tag}>{_inline(line[level:].strip())}</{tag}>")
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            out.append(_table(block))
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
        elif (m := re.fullmatch(r"!\[(.*)\]\((.*)\)", line.strip())):
            out.append(f'<figure><img src="{_e(m[2])}" alt="{_e(m[1])}"></figure>')
            i += 1
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                para.append(lines[i])
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def _table(block: list[str]) -> str:
    head, rows = _cells(block[0]), [_cells(r) for r in block[2:]]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _inline(text: str) -> str:
    text = html.escape(text, quote=False)
    text = text.replace("&lt;u&gt;", "<u>").replace("&lt;/u&gt;", "</u>")
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)

