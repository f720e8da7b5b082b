"""The general metric reader: the shapes training code prints, whatever prints them (stdlib only, no I/O).

One line (one ``\\r`` update, colour codes already gone) in, ``{metric: value}`` out, with the names made
canonical. Shapes, each as some project prints it:

    key=value, key: value            step=12 loss=3.21 lr=3e-4        Train Epoch: 1 [...]  Loss: 0.336354
    key value between | or tabs      | epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.27 | loss  7.62 |
    meters, Key value (average)      Loss 6.9077e+00 (6.9088e+00)     loss: 6.9 (6.9)
    progress N/M, [N/M], N / M       [  10/5005]   [38400/60000 (64%)]   100 / 1101   step  10/5000
    value first, with its unit       123.45 ms | 45.6% bf16 MFU | 123456 tok/s     5s 10ms/step    207.45/s
    dicts and JSON                   {'loss': 1.2, 'learning_rate': 5e-05}    {"epoch": 1, "valid_loss": "9.8"}

Names (``metric_names``): lower case, words joined by ``_``, ``@`` dropped (``Acc@1`` -> ``acc1``); a ``train``
word goes (``train loss``, ``loss/train``, ``train_loss`` -> ``loss``); ``lr``/``learning_rate`` -> ``lr``; rates
are ``tok_s`` (tokens, words), ``samples_s`` (samples, images) and ``steps_s`` (it/s, updates); a time per step
(``time``, ``ms/batch``, ``10ms/step``) becomes ``steps_s`` when the line gives no step rate. Only names of
metrics are read: ``line 120`` of a traceback or ``max_epochs=2`` are not metrics.

Evaluation metrics keep their own names: ``val_<name>`` for val/valid/validation/eval/dev, ``test_<name>`` for
test, whether the word is in the key (``valid loss``, ``eval_loss``) or opens the line (``Test set: Average loss``);
a summary line (``end of epoch``, ``End of training``, fairseq's ``| train |``, HF's ``***** train metrics *****``)
keeps its metrics as ``summary_<name>``. So an eval or a summary never overwrites the training loss. Counters
(``step``, ``epoch``, ``total_steps``, ``total_epochs``, ``tokens``) keep their names everywhere.
"""

from __future__ import annotations

import json
import re

from .metric_names import RATES, STRUCTURAL, TIMES, TRAIN_WORDS, key_name, name_of

Event = dict[str, float]

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf)"
_VALUE = rf"(?:\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?(?!\d)|{NUMBER})"
_KEY = r"[A-Za-z][\w@.\-/]*"
# a key (up to three words), '=', ':' or spaces, a value (maybe [in brackets], /total, a unit stuck to it)
_ITEM = re.compile(
    rf"(?<![\w@.\-])(?P<key>{_KEY}(?: {_KEY}){{0,2}}?)['\"]?(?P<sep>\s*[=:]\s*|\s+)(?P<open>\[\s*)?"
    rf"(?P<num>{_VALUE})(?:\s*/\s*(?P<total>\d+)(?![\d/]))?(?P<unit>%|/[A-Za-z]+|[A-Za-z]+(?:/[A-Za-z]+)?)?"
    r"(?P<close>\s*\])?(?![\w.])(?!:\d)")
# the common case first, cheaper to find: one or two words, '=' or ':', a value ("loss=2.3", "valid loss: 2.3")
_PAIR = re.compile(
    rf"(?<![\w@.\-])(?P<key>(?:[A-Za-z]+[ _])?{_KEY})['\"]?(?P<sep>\s*[=:]\s*)(?P<open>\[\s*)?"
    rf"(?P<num>{_VALUE})(?:\s*/\s*(?P<total>\d+)(?![\d/]))?(?P<unit>%|/[A-Za-z]+|[A-Za-z]+(?:/[A-Za-z]+)?)?"
    r"(?P<close>\s*\])?(?![\w.])(?!:\d)")
# a number's digits or a nan/inf: what a line needs before the slower patterns look for items in it
_NUMERAL = re.compile(r"\d|(?i:nan|inf)")
_RUN = re.compile(r"\d+")
# a name with a number in it after a '-' or '/' ("top-1", "loss/0"): the number is the name's, not a value, and which
# digits it has makes the name ("top-1" is acc1, "top-0" no metric), so lines alike but for them are not alike
NAMED = re.compile(r"(?<![\w@.\-/])[A-Za-z][\w@.\-/]*[-/]\d[\w@.\-/]*")
# such a name as (a word of) a key, a value after it: "top-1=5", "top-1 loss 5" ("ckpt-000120.npz" is none)
NAMED_KEY = re.compile(NAMED.pattern + r"(?: [A-Za-z][\w@.\-/]*){0,2}['\"]?(?:\s*[=:]\s*|\s+)"
                       r"\[?\s*[-+]?(?:\.?\d|(?i:nan|inf))")
# a number as the items read one (never inside a name: acc1, bf16): lines alike but for these read alike
_TOKEN = re.compile(rf"(?<![A-Za-z_@\d.,])(?:{_VALUE})")
_TOKEN_SPLIT = re.compile(f"({_TOKEN.pattern})")
_PLANS: dict[str, list | None] = {}  # a line's shape -> how its numbers become items (None: read it in full)
PLANS_MAX = 1024
# value first: "123.45 ms", "10ms/step", "123456 tok/s", "207.45/s", "45.6% bf16 MFU"
_FIRST = re.compile(
    rf"(?<![\w.\-/])(?P<num>{NUMBER})(?:(?P<unit>/s|\s?[A-Za-z]+/[A-Za-z]+|\s?ms)(?![\w/])"
    r"|%\s+(?:\w+\s+)?(?P<name>[A-Za-z]\w*))")
_PROGRESS = re.compile(r"(?<![\w.:/\-])\[?\s*(\d+)\s*/\s*(\d+)(?![\d/.])\s*\]?")
_SUFFIX = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "m": 1e6}

_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "us": 1e-6}
_SIZES = {"GiB", "GB", "MiB", "MB", "KiB", "KB", "TB"}
_UNIT_RATES = {"it/s": "steps_s", "steps/s": "steps_s", "tok/s": "tok_s", "tokens/s": "tok_s", "/s": "samples_s",
               "samples/s": "samples_s", "img/s": "samples_s", "ex/s": "samples_s", "s/it": "s_it",
               "ms/step": "ms_step", "ms/batch": "ms_batch", "ms/it": "ms_it", "s/step": "s_step"}
_SUMMARY = re.compile(r"(?i)\bend of (?:epoch|training)\b|\bsummary\b|\bfinal\b|\baveraged stats\b|\btotal time\b"
                      r"|^\s*\*\s")
_EVAL_OPEN = re.compile(r"(?i)^\W*(?:(?P<test>test(?:ing)?)"
                        r"|(?P<val>val(?:id(?:ation|ate)?)?|eval(?:uation|uating)?|dev))"
                        r"(?: set)?\s*(?:[:\[|(]|-\s|on\b|results?\b|metrics?\b|$)")
_SEGMENT_EVAL = re.compile(r"\|\s*(valid|val|test|eval)\s*\||\bvalid on '")
_SEGMENT_TRAIN = re.compile(r"\|\s*train\s*\|")
_MODE = re.compile(r"\((val|test)\)")  # mmengine: "Epoch(val) [1][500/500]  accuracy/top1: 76.1"
_HF_SECTION = re.compile(r"\*{3,}\s*(\w+) metrics\s*\*{3,}")
_DICT_ITEM = re.compile(rf"""['"]([^'"]+)['"]\s*:\s*(?:(?:np|numpy)\.\w+\(|tensor\()?['"]?({NUMBER})['"]?\)?"""
                        r"\s*(?=[,}])")
JSON_TIME_KEYS = ("time", "timestamp", "ts")


def kind_of(text: str, before: str = "") -> str:
    """``val``/``test`` for an evaluation line, ``summary`` for a summary line, else ``""``; ``before`` is the kind of
    the previous metric line (ImageNet's `` * Acc@1`` line closes its evaluation)."""
    m = _EVAL_OPEN.match(text)
    if m is not None:
        return "test" if m["test"] else "val"
    if "|" in text:
        s = _SEGMENT_EVAL.search(text)
        if s is not None:
            return "test" if s[1] == "test" else "val"
        if _SEGMENT_TRAIN.search(text):
            return "summary"
    if "(" in text and (mode := _MODE.search(text)) is not None:
        return mode[1]
    low = text.lower()
    if ("*" in text or "end of" in low or "summary" in low or "final" in low or "averaged" in low
            or "total time" in low) and _SUMMARY.search(text):
        return before if before in ("val", "test") and text.lstrip().startswith("*") else "summary"
    return ""


def section(text: str) -> str | None:
    """Hugging Face's ``***** eval metrics *****`` header: the kind of the ``  key = value`` lines under it."""
    m = _HF_SECTION.search(text)
    if m is None:
        return None
    word = m[1].lower()
    return "summary" if word in TRAIN_WORDS else "test" if word in ("test", "predict") else "val"


def _value(num: str, unit: str | None) -> float:
    value = float(num.replace(",", "")) if "," in num else float(num)
    if unit and unit in _SUFFIX:
        value *= _SUFFIX[unit]
    return value


class Found:
    """The items of one line, gathered before they become an event."""

    __slots__ = ("values", "times", "progress", "epoch_total", "step_total", "strong", "recorded")

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}  # (split, canonical) -> value
        self.times: list[float] = []  # seconds per step
        self.progress: tuple[float, float] | None = None  # (n, per epoch or total) of a counter without a name
        self.epoch_total: float | None = None
        self.step_total: float | None = None  # "step 10/5000", "Step [100/600]"
        self.strong: set[tuple[str, str]] = set()
        self.recorded: list | None = None

    def put(self, split: str, name: str, value: float, *, weak: bool = False) -> None:
        """A value given as ``key: value`` or ``key=value`` wins over one given as ``key value``; else the first."""
        key = (split, name)
        if key in self.values and (weak or key in self.strong):
            return
        self.values[key] = value
        if not weak:
            self.strong.add(key)


def scan(text: str) -> Found:
    """Every item of ``text``: keyed values (``key=value`` and ``key: value`` first, then the rest: ``key value``,
    keys of three words), values given with their unit, counters.

    Training logs print the same few shapes again and again with other numbers: the first line of a shape is read
    in full, and what it took from which number is kept (``_PLANS``); the next lines of that shape only have their
    numbers read into the same places."""
    parts = _TOKEN_SPLIT.split(text)
    if len(parts) == 1:
        return Found()
    tokens = parts[1::2]
    # the text between the numbers, and each number's form (its runs of digits made one 0): the patterns read 12,
    # -1.5, 1,234, 7e+02 and nan differently ("Epoch 3/7.5E+02" is epoch 3, "Epoch 3/7e+02" nothing: its "7e" is a
    # total with a unit that fits no epoch)
    shape = "\0".join(parts[::2]) + "\1" + "\2".join(
        "0" if t.isdigit() else "1" if t[0] != "." != t[-1] and t.replace(".", "", 1).isdigit() else _RUN.sub("0", t)
        for t in tokens)  # ("1": 0.0, digits on both sides of a point, the common case made cheap)
    if ("-\0" in shape or "/\0" in shape) and (named := NAMED.findall(text)):  # (a number just after a - or /)
        shape += "\3" + "\3".join(named)
    plan = _PLANS.get(shape, False)
    if plan is not False:
        return _replay(plan, tokens) if plan is not None else _scan(text, None)
    spans = [m.span() for m in _TOKEN.finditer(text)]
    found = _scan(text, Recorder({start: (i, end) for i, (start, end) in enumerate(spans)}))
    if len(_PLANS) >= PLANS_MAX:
        _PLANS.clear()
    _PLANS[shape] = found.recorded
    return found


def planned(text: str) -> tuple[Found, list | None, list[tuple[int, int]]]:
    """A full read of ``text`` with its plan: what it took from which number, and where each number is (for
    ``metric_templates``); the plan is None when some item's number is not one of the line's numbers."""
    spans = [m.span() for m in _TOKEN.finditer(text)]
    found = _scan(text, Recorder({start: (i, end) for i, (start, end) in enumerate(spans)}))
    return found, found.recorded, spans


class Recorder:
    """What a full read took from which number of the line (by its index): the plan of its shape, or None when
    some item's number is not one of the line's numbers as the tokens cut them."""

    __slots__ = ("at", "ops")

    def __init__(self, at: dict[int, tuple[int, int]]) -> None:
        self.at, self.ops = at, []

    def index(self, m: re.Match[str], group: str | int) -> int | None:
        start, end = m.span(group)
        found = self.at.get(start)
        return found[0] if found is not None and found[1] == end else None

    def add(self, op: tuple, *indices: int | None) -> None:
        if self.ops is not None:
            self.ops = None if any(i is None for i in indices) else self.ops + [op]


def _replay(plan: list, tokens: list[str]) -> Found:
    found = Found()
    for op in plan:
        kind = op[0]
        if kind == "put":
            _, split, name, factor, weak, i, total = op
            value = _value(tokens[i], None) * factor
            if total is not None:
                whole = float(tokens[total])
                value = value / whole if whole else value
            found.put(split, name, value, weak=weak)
        elif kind == "time":
            value = _value(tokens[op[2]], None) * op[1]
            if value > 0:
                found.times.append(value)
        elif kind == "epoch_total":
            found.epoch_total = float(tokens[op[1]])
        elif kind == "step_total":
            found.step_total = float(tokens[op[1]])
        elif kind == "progress" and found.progress is None and int(float(tokens[op[2]])) > 0:
            found.progress = (float(tokens[op[1]]), float(tokens[op[2]]))
    return found


def _scan(text: str, rec: Recorder | None) -> Found:
    found = Found()
    found.recorded = None
    blank: list[tuple[int, int]] = []
    _items(_PAIR, text, found, blank, rec)
    rest = _without(text, blank)
    # (a nan is a value too: llm.c's "val loss nan" is a diverged run's, as "val loss 3.5" is a loss)
    if _NUMERAL.search(rest):
        _items(_ITEM, rest, found, blank, rec)
        rest = _without(text, blank)
        if ("/" in rest or "ms" in rest or "%" in rest) and _NUMERAL.search(rest):
            _value_first(rest, found, rec)
    if rec is not None:
        found.recorded = rec.ops
    return found


def _without(text: str, blank: list[tuple[int, int]]) -> str:
    """``text`` with the spans already read blanked out."""
    if not blank:
        return text
    pieces, at = [], 0
    for start, end in sorted(blank):
        pieces += [text[at:start], " " * (end - start)]
        at = end
    return "".join(pieces) + text[at:]


def _items(rx: re.Pattern[str], text: str, found: Found, blank: list[tuple[int, int]], rec: Recorder | None) -> None:
    for m in rx.finditer(text):
        named = key_name(m["key"])
        if named is None:
            continue
        split, name, scale = named
        unit = m["unit"]
        spaced = m["sep"].strip() == ""
        if unit is not None and unit not in _SUFFIX and unit != "%":
            rate, rate_scale = _UNIT_RATES.get(unit), 1.0
            if rate is None and "/" in unit and (named_unit := name_of(unit)) is not None:
                rate, rate_scale = named_unit[1], named_unit[2]  # "speed: 31.8Ktok/s"
            if split != "time" and rate in RATES:  # "speed: 3.5it/s"
                found.put("", rate, float(m["num"].replace(",", "")) * rate_scale)
                if rec is not None:
                    rec.add(("put", "", rate, rate_scale, False, rec.index(m, "num"), None), rec.index(m, "num"))
                _blank(blank, m)
                continue
            if split == "time" and unit in _TIME_UNITS:
                scale = _TIME_UNITS[unit]
            elif unit not in _SIZES:
                _blank(blank, m)
                continue  # "loss=3ms": a unit that does not fit the name
        try:
            factor = scale * (_SUFFIX[unit] if unit in _SUFFIX else 1.0)
            value = _value(m["num"], None) * factor
        except ValueError:
            continue
        _blank(blank, m)
        i = rec.index(m, "num") if rec is not None else None
        if split == "time":
            if value > 0:
                found.times.append(value)
            if rec is not None:
                rec.add(("time", factor, i), i)
            continue
        fraction = None
        if m["total"] is not None:
            total = float(m["total"])
            t = rec.index(m, "total") if rec is not None else None
            if name == "epoch":
                found.epoch_total = total
                if rec is not None:
                    rec.add(("epoch_total", t), t)
            elif name == "step":
                found.step_total = total
                if rec is not None:
                    rec.add(("step_total", t), t)
            elif name not in STRUCTURAL:
                value = value / total if total else value  # "Accuracy: 9800/10000" is a fraction
                fraction = t if rec is not None else None
                if rec is not None:
                    rec.add(("check",), t)
        found.put(split, name, value, weak=spaced)
        if rec is not None:
            rec.add(("put", split, name, factor, spaced, i, fraction), i)


def _value_first(rest: str, found: Found, rec: Recorder | None) -> None:
    """What is left of a line once its keyed items are read: values given with their unit, a bare counter."""
    for m in _FIRST.finditer(rest):
        i = rec.index(m, "num") if rec is not None else None
        if m["name"]:
            named = name_of(m["name"])
            if named is not None and not named[0]:
                found.put("", named[1], float(m["num"]), weak=True)
                if rec is not None:
                    rec.add(("put", "", named[1], 1.0, True, i, None), i)
            continue
        unit = m["unit"].strip()
        rate, scale = _UNIT_RATES.get(unit, unit), 1.0
        if rate not in RATES and rate not in TIMES:
            named = name_of(unit)  # "31.8 Ktok/s"
            if named is not None and named[1] in RATES:
                rate, scale = named[1], named[2]
        if rate in RATES:
            found.put("", rate, float(m["num"]) * scale, weak=True)
            if rec is not None:
                rec.add(("put", "", rate, scale, True, i, None), i)
        elif rate in TIMES:
            if float(m["num"]) > 0:
                found.times.append(float(m["num"]) * TIMES[rate])
            if rec is not None:
                rec.add(("time", TIMES[rate], i), i)
    if found.progress is None and "/" in rest:
        m = _PROGRESS.search(rest)
        if m is not None:
            if int(m[2]) > 0:
                found.progress = (float(m[1]), float(m[2]))
            if rec is not None:
                n, total = rec.index(m, 1), rec.index(m, 2)
                rec.add(("progress", n, total), n, total)


def event(found: Found, kind: str = "") -> Event:
    """The event of a line of ``kind``: evaluation metrics as ``val_``/``test_<name>``, a summary's as
    ``summary_<name>``; a time per step becomes ``steps_s`` on a training line that gives no step rate. Rates
    and times of evaluations and summaries are left out: they are not the training's."""
    out: Event = {}
    for (split, name), value in found.values.items():
        if name in STRUCTURAL:
            out[name] = value
            continue
        split = split or (kind if kind in ("val", "test") else "")
        if split:
            if name not in RATES:
                out[f"{split}_{name}"] = value
        elif kind == "summary":
            if name not in RATES:
                out[f"summary_{name}"] = value
        else:
            out[name] = value
    if not kind and found.times and "steps_s" not in out:
        out["steps_s"] = 1.0 / found.times[0]
    return out


def pairs(text: str) -> Event | None:
    """The training metrics of ``text`` as pairs alone (a progress bar's postfix), no counters read."""
    out = event(scan(text))
    return out or None


def _blank(blank: list[tuple[int, int]], m: re.Match[str]) -> None:
    blank.append(m.span())


def dict_items(text: str) -> list[tuple[str, float]] | None:
    """The numeric items of a JSON object or a Python dict's repr (HF's ``{'loss': 1.2, ...}``, numbers as numbers,
    as quoted strings or as ``np.float64(...)``); None when ``text`` is not one. Nested objects are flattened
    (``{"train": {"loss": 1}}`` -> ``train/loss``)."""
    if not text.endswith("}"):
        return None
    if text.startswith('{"'):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out: list[tuple[str, float]] = []
            _flatten("", obj, out)
            return out
    if text.startswith(("{'", '{"')):
        items = [(k, float(v)) for k, v in _DICT_ITEM.findall(text)]
        return items
    return None


def _flatten(prefix: str, obj: dict, out: list[tuple[str, float]]) -> None:
    for key, value in obj.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            _flatten(name, value, out)
        elif isinstance(value, list) and value and isinstance(value[0], (int, float)) \
                and not isinstance(value[0], bool):
            out.append((name, float(value[0])))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((name, float(value)))
        elif isinstance(value, str):
            try:
                out.append((name, float(value)))
            except ValueError:
                pass


def dict_found(items: list[tuple[str, float]]) -> Found:
    """The items of a dict line as ``Found``: its ``time`` is a timestamp (``t``), not a time per step."""
    found = Found()
    for key, value in items:
        if key.lower() in JSON_TIME_KEYS:
            found.put("", "t", value)
            continue
        named = name_of(key)
        if named is None or named[0] == "time":
            continue
        split, name, scale = named
        found.put(split, name, value * scale)
    return found
