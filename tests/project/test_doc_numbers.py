"""Deterministic numbers in README.md and docs/*.md against the scripts that produce them (issue 31, item 4).

Each test parses the number from the page's text (never a copy of it here) and compares it, at the rounding the page
uses, with what the producing script computes now (cheap: tiny shapes, seconds) or, for results of runs that take
CPU hours (the novel-view, camera-following and ViT benchmarks), with the JSON the script wrote, formatted by the
script's own table function. Timing numbers are not checked here (they carry machine, date and command instead).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"

pytestmark = pytest.mark.usefixtures("one_thread")


def page(name: str) -> str:
    return (ROOT / name).read_text()


def load_script(path: str, name: str):
    """A script of ``scripts/`` or ``benchmarks/`` imported as a module (they are not packages)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def doc_table(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells, ``**`` bold marks dropped) of the markdown table whose header starts with
    ``header_start``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split("|")])
    return rows


def as_printed(value: float, text: str) -> float:
    """``value`` rounded as ``text`` is written: ``8.4e-3`` (two significant digits), ``0.245`` (three decimals,
    half up)."""
    mantissa = re.match(r"[-+]?(\d+)(?:\.(\d+))?(e[-+]?\d+)?$", text)
    assert mantissa, f"not a number as the docs print them: {text!r}"
    decimals = len(mantissa.group(2) or "")
    if mantissa.group(3):
        return float(f"{value:.{decimals}e}")
    # half up on the value as the script wrote it (scores are stored at 4 decimals: 0.2365 is printed 0.237)
    return float(Decimal(repr(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def assert_printed(value: float, text: str, where: str) -> None:
    assert math.isclose(as_printed(value, text), float(text), rel_tol=0, abs_tol=1e-12), (
        f"{where}: the page says {text}, the script gives {value:.4g}"
    )


# -- bf16 errors against fp64 (recomputed: seconds) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def camera_accuracy() -> dict:
    """``python benchmarks/bench_camera.py --check --shapes tiny``'s accuracy rows, by encoding."""
    bench = load_script("benchmarks/bench_camera.py", "bench_camera_for_docs")
    return {row["encoding"]: row for row in bench.check_accuracy("cpu", "tiny")}


def test_camera_bf16_errors_in_docs_cameras(camera_accuracy):
    rows = doc_table(page("docs/cameras.md"), "| encoding | bf16 vs fp64")
    assert {row[0].split()[0] for row in rows} == set(camera_accuracy)
    for name, error, sdpa in rows:
        measured = camera_accuracy[name.split()[0]]
        assert_printed(measured["rel_max_error"], error, f"docs/cameras.md {name}")
        if sdpa != "-":
            assert_printed(measured["sdpa_bf16_rel_max_error"], sdpa, f"docs/cameras.md {name} (SDPA)")


def test_camera_bf16_errors_in_docs_results(camera_accuracy):
    row = next(line for line in page("docs/results.md").splitlines() if line.startswith("| camera encodings, bf16"))
    found = dict(re.findall(rf"(PRoPE|UCPE|RayRoPE) ({NUMBER})", row))
    assert set(found) == {"PRoPE", "UCPE", "RayRoPE"}, row
    for name, text in found.items():
        assert_printed(camera_accuracy[name.lower()]["rel_max_error"], text, f"docs/results.md {name}")
    sdpa = re.search(rf"plain bf16 SDPA: ({NUMBER})", row).group(1)
    assert_printed(camera_accuracy["prope"]["sdpa_bf16_rel_max_error"], sdpa, "docs/results.md SDPA")


@pytest.fixture(scope="module")
def edit_precision() -> dict:
    """``python -m tests.cuda.test_edit_cuda --device cpu``'s precision rows: case -> (edit error, stock error)."""
    from tests.cuda import test_edit_cuda as check

    torch.manual_seed(0)  # the checks seed their modules themselves; this makes the call independent of order
    rows = check.precision_checks(torch.device("cpu"))
    return {case.split()[0]: (edit, stock) for case, edit, stock in rows}


@pytest.mark.parametrize("name", ["docs/editing.md", "docs/results.md"])
def test_edit_bf16_errors(edit_precision, name):
    pattern = (
        rf"band shared attention ({NUMBER}) \(stock ({NUMBER})\), LooseRoPE logit mix[a-z ]*? ({NUMBER}) "
        rf"\(stock ({NUMBER})\)"
    )
    found = re.search(pattern, " ".join(page(name).split()))
    assert found, f"{name}: the editing precision sentence is missing"
    band, band_stock, loose, loose_stock = found.groups()
    assert_printed(edit_precision["band"][0], band, f"{name} band")
    assert_printed(edit_precision["band"][1], band_stock, f"{name} band (stock)")
    assert_printed(edit_precision["looserope"][0], loose, f"{name} LooseRoPE")
    assert_printed(edit_precision["looserope"][1], loose_stock, f"{name} LooseRoPE (stock)")


# -- counts (recomputed) ----------------------------------------------------------------------------------------------


def _count(text: str) -> int:
    return int(text.replace(",", ""))


def test_novel_view_parameter_counts():
    from mmpos.training.task_configs import NVSConfig
    from mmpos.training.tasks.nvs import build_model

    text = " ".join(page("docs/results.md").split())
    sentence = re.search(r"Parameters: (.*?)\. ", text).group(1)
    documented = {}
    for count, names in re.findall(r"([\d,]{6,}) \(([^)]*)\)", sentence):
        for name in re.findall(r"`(\w+)`", names):
            documented[name] = _count(count)
    assert set(documented) == {"none", "prope", "ucpe", "rayrope", "plucker"}, sentence
    for name, count in documented.items():
        model = build_model(NVSConfig(encoding=name))
        assert sum(p.numel() for p in model.parameters()) == count, name


def _safetensors_count(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return sum(math.prod(handle.get_slice(k).get_shape()) for k in handle.keys())


def test_world_video_parameter_counts():
    text = " ".join(page("docs/results.md").split())
    base = re.search(r"`WanTransformer3DModel` \([^)]*?, ([\d.]+)M parameters\)", text).group(1)
    ucpe = re.search(r"`ucpe` \(([\d,]+) parameters\)", text).group(1)
    plucker = re.search(r"`plucker` \(([\d,]+)\)", text).group(1)
    folder = ROOT / "assets/world-video"
    weights = "diffusion_pytorch_model.safetensors"
    assert f"{_safetensors_count(folder / 'transformer' / weights) / 1e6:.2f}" == base
    assert _safetensors_count(folder / "camera-ucpe" / weights) == _count(ucpe)
    assert _safetensors_count(folder / "camera-plucker" / weights) == _count(plucker)


def test_the_number_of_diffusers_families():
    from mmpos.integrations.diffusers.families import list_families

    readme = re.search(r"on all (\d+) diffusers families", page("README.md")).group(1)
    results = re.search(r"over the (\d+) families", page("docs/results.md")).group(1)
    table = page("README.md").split("<!-- families-table:start -->")[1].split("<!-- families-table:end -->")[0]
    assert int(readme) == int(results) == len(list_families()) == table.count("\n| `")


# -- results of long runs: the page's table == the script's table of its JSON -------------------------------------


def test_novel_view_table_is_the_results_json():
    nvs = load_script("scripts/eval_nvs.py", "eval_nvs_for_docs")
    runs = json.loads((ROOT / "assets/results/nvs/results.json").read_text())
    rows = doc_table(page("docs/results.md"), "| encoding | test PSNR |")
    assert [r[0] for r in rows] == [*dict.fromkeys(run["encoding"] for run in runs)]
    columns = [f"{s}_{m}" for s in ("test", "wide", "fisheye") for m in ("psnr", "ssim")]
    for row in rows:
        group = [run for run in runs if run["encoding"] == row[0]]
        for column, cell in zip(columns, row[1:7]):
            values = [run[column] for run in group]
            digits = 3 if column.endswith("ssim") else 2
            expected = nvs.summary(values, digits) if len(group) > 1 else f"{values[0]:.{digits}f}"
            assert cell == expected, f"{row[0]} {column}: page {cell}, results.json {expected}"
        for offset, name in ((7, "wide"), (8, "fisheye")):
            gap = sum(run[f"{name}_psnr"] - run["test_psnr"] for run in group) / len(group)
            assert row[offset] == f"{gap:+.2f}", f"{row[0]} {name} - test"
        if row[9] != "-":
            assert row[9] == f"{sum(run['cpu_seconds'] for run in group) / len(group) / 60:.1f}", row[0]


def test_camera_following_table_is_the_results_json():
    follow = load_script("scripts/eval_camera_following.py", "eval_camera_following_for_docs")
    summary = json.loads((ROOT / "assets/results/camera_following/results.json").read_text())["summary"]
    expected = [line.split("|")[2:-1] for line in follow.table(summary).splitlines()[2:]]
    rows = doc_table(page("docs/results.md"), "| condition | PSNR (dB) |")
    assert len(rows) == len(expected)
    for row, cells in zip(rows, expected):
        assert [c if c != "-" else "n/a" for c in row[1:]] == [c.strip() for c in cells], row[0]


def test_vit_benchmark_table_is_the_results_json():
    bench = load_script("scripts/vit_benchmark.py", "vit_benchmark_for_docs")
    collected = json.loads((ROOT / "assets/results/vit_bench/results.json").read_text())
    expected = bench.markdown(collected).splitlines()[2:]
    text = page("docs/results.md")
    header = bench.markdown(collected).splitlines()[0]
    start = text.index(header)
    documented = text[start:].splitlines()[2 : 2 + len(expected)]
    assert documented == expected


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_nvs_numbers_in_the_text_are_the_results_json():
    """README's headline (PRoPE - Plücker test PSNR) and results.md's 450-step test PSNRs, from the shipped JSONs."""
    runs = json.loads((ROOT / "assets/results/nvs/results.json").read_text())
    psnr = {e: _mean(r["test_psnr"] for r in runs if r["encoding"] == e) for e in ("prope", "plucker")}
    headline = re.search(rf"PRoPE beats Plücker rays by ({NUMBER}) dB PSNR", page("README.md")).group(1)
    assert f"{psnr['prope'] - psnr['plucker']:.2f}" == headline
    early = json.loads((ROOT / "assets/results/nvs/results_450_steps.json").read_text())
    text = " ".join(page("docs/results.md").split())
    sentence = re.search(r"\(test PSNR: ([^)]*)\)", text).group(1)
    documented = dict(re.findall(rf"(\w+) ({NUMBER})", sentence))
    assert set(documented) == {"none", "plucker", "rayrope", "ucpe", "prope"}, sentence
    for name, text_value in documented.items():
        assert f"{_mean(r['test_psnr'] for r in early if r['encoding'] == name):.2f}" == text_value, name


def test_camera_following_headline_is_the_results_json():
    summary = json.loads((ROOT / "assets/results/camera_following/results.json").read_text())["summary"]
    gain = summary["ucpe"]["psnr"] - summary["no camera"]["psnr"]
    for name in ("README.md", "docs/results.md"):
        found = re.search(rf"UCPE adapter[^+\d]{{0,30}}({NUMBER}) dB PSNR", " ".join(page(name).split()))
        assert found, f"{name}: the UCPE adapter's PSNR gain is missing"
        assert f"{gain:+.2f}" == found.group(1), name
    motions = dict(
        re.findall(rf"(dolly|orbit|pan) ({NUMBER})", re.search(r"\(dolly [^)]*\)", page("docs/results.md")).group())
    )
    assert set(motions) == {"dolly", "orbit", "pan"}
    for motion, value in motions.items():
        each = {c: summary[c]["per_motion"][motion]["psnr"] for c in ("ucpe", "no camera")}
        assert f"{each['ucpe'] - each['no camera']:+.2f}" == value, motion


def test_vit_benchmark_headline_is_the_results_json():
    top1 = json.loads((ROOT / "assets/results/vit_bench/results.json").read_text())["top1"]
    line = re.search(r"1\.5x its training resolution: (.*?) top-1", page("README.md")).group(1)
    names = {"RoPE-Mixed": "rope_mixed", "sin-cos APE": "ape_sincos", "axial RoPE": "rope_axial"}
    documented = dict(re.findall(rf"(RoPE-Mixed|sin-cos APE|axial RoPE) ({NUMBER}) %", line))
    assert set(documented) == set(names), line
    for label, value in documented.items():
        assert f"{_mean(top1[names[label]]['1.5/none']):.1f}" == value, label


# -- slow: re-run a shipped model's evaluation ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: 2.5 CPU minutes (MMPOS_SLOW=1)")
def test_camera_following_reproduces(tmp_path):
    """``python scripts/eval_camera_following.py --scenes 8`` on the shipped world video model gives the table."""
    command = [sys.executable, str(ROOT / "scripts/eval_camera_following.py"), "--scenes", "8", "--out", str(tmp_path)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads((tmp_path / "results.json").read_text())["summary"]
    shipped = json.loads((ROOT / "assets/results/camera_following/results.json").read_text())["summary"]
    follow = load_script("scripts/eval_camera_following.py", "eval_camera_following_for_docs")
    assert follow.table(fresh) == follow.table(shipped)


# -- timing tables: machine, date and command above each -------------------------------------------------------------

TIMING_TABLES = [
    ("docs/cameras.md", "| encoding | ms |"),
    ("docs/multimodal.md", "| shape | method | table ms"),
    ("docs/results.md", "| what | result | target | command |"),
    ("docs/results.md", "| shape | dtype | method | ms (q+k)"),
    ("docs/backbones.md", "| encoding | ms / step (fwd+bwd) |"),
    ("docs/backbones.md", "| variant | ms / forward (median) |"),
    ("docs/variants.md", "| shape | method | ms | saved MB | peak MB |"),
    ("docs/variants.md", "| shape | method | run 1: ms / x plain |"),
    ("docs/variants.md", "| shape | method | ms | x plain | saved MB |"),
    ("docs/variants.md", "| encoding | graphs / breaks (training forward) |"),
    ("docs/vit_training.md", "| model | ms / step | images/s |"),
    ("docs/video.md", "| video tokens | stock | `plucker` |"),
]


@pytest.mark.parametrize(
    "name, header", TIMING_TABLES, ids=[f"{n}:{h.split('|')[2].strip()}" for n, h in TIMING_TABLES]
)
def test_timing_tables_carry_machine_date_and_command(name, header):
    """Above every timing table with this header, in its section, the page names the machine, the date
    (YYYY-MM-DD) and the command."""
    text = page(name)
    for start in [m.start() for m in re.finditer(re.escape("\n" + header), text)]:
        check_timing_context(name, header, text[:start])


def check_timing_context(name: str, header: str, before: str) -> None:
    context = re.split(r"\n#+ ", before)[-1]  # the table's section, from its heading down to the table
    assert re.search(r"\b2\d{3}-\d{2}-\d{2}\b", context), f"{name} {header}: no date above the table"
    assert re.search(r"\b(CPU|GPU)\b", context), f"{name} {header}: no machine above the table"
    assert re.search(r"`[^`]*(python|pytest)[^`]*`", context) or "command" in header, f"{name}: no command"


# the editing table's method labels -> the script's method names (a "a / b / c" label is one row per value)
EDIT_METHODS = {
    "ground truth": ["ground truth"],
    "plain Fill (same canvas)": ["plain Fill (same canvas)"],
    "PE transplant, tau 0.85": ["PE transplant tau=0.85"],
    "PE transplant, tau 0.5": ["PE transplant tau=0.5"],
    "unedited collage": ["unedited collage"],
    "plain Kontext (LooseRoPE strength 0)": ["plain Kontext (LooseRoPE strength 0)"],
    "LooseRoPE strength 0.5 / 1 / 2": [f"LooseRoPE strength {s}" for s in (0.5, 1.0, 2.0)],
    "ground truth (target in the reference's style)": ["ground truth (target in reference style)"],
    "no sharing (content prompt)": ["no sharing (content prompt)"],
    "shared attention (band strength 0)": ["shared attention (band strength 0)"],
    "band s_hf 0.75 / 0.5 / 0.25 / 0": [f"band s_hf={s}" for s in ("0.75", "0.5", "0.25", "0")],
    "band, paper schedule": ["band paper schedule s_hf 0.25->0.75"],
}
EDIT_TASKS = {"transplant": "transplant", "harmonise": "harmonise", "style": "style"}


def editing_table_scores() -> list[tuple[str, str, str, str]]:
    """``(task, script method, score key, printed value)`` for every number of results.md's editing table."""
    found = []
    for task, label, scores in doc_table(page("docs/results.md"), "| task | method | scores |"):
        key = next(k for k in sorted(EDIT_METHODS, key=len, reverse=True) if label.startswith(k))
        methods = EDIT_METHODS[key]
        for score in scores.split(", "):
            name, values = re.match(r"([a-zA-Z ]+?) ([\d. /]+)$", score).groups()
            values = values.split(" / ")
            assert len(values) == len(methods), f"{label}: {score}"
            for method, value in zip(methods, values):
                found.append((EDIT_TASKS[task], method, name.replace(" ", "_").lower(), value))
    return found


def test_the_editing_table_is_parsed_whole():
    """Every cell of the editing table maps to a method and a score the script writes."""
    scores = editing_table_scores()
    assert len(scores) == 4 * 3 + 5 * 3 + 8 * 3
    assert {key for _, _, key, _ in scores} == {
        "mask_iou", "colour_error", "outside_change", "identity_iou", "style_texture", "margin_error", "palette",
        "texture", "layout_copy",
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: 3-15 CPU minutes (MMPOS_SLOW=1)")
def test_editing_table_reproduces(tmp_path):
    """``python scripts/eval_editing.py --count 16 --steps 20`` on the shipped world models gives results.md's
    editing table (fixed seeds: deterministic on one machine)."""
    out = tmp_path / "eval_editing.json"
    command = [
        sys.executable,
        str(ROOT / "scripts/eval_editing.py"),
        "--count",
        "16",
        "--steps",
        "20",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    check_editing_scores(json.loads(out.read_text())["results"])


def check_editing_scores(results: dict) -> None:
    rows = {(task, row["method"]): row for task, task_rows in results.items() for row in task_rows}
    wrong = []
    for task, method, key, value in editing_table_scores():
        if as_printed(rows[(task, method)][key], value) != float(value):
            wrong.append(f"{task} / {method} / {key}: page {value}, script {rows[(task, method)][key]}")
    assert not wrong, wrong
