"""Reading prompt JSONL files: every bad line reported with its number and the exact reason."""

from __future__ import annotations

import json

import pytest

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.tasks.prompts import (
    LineProblem,
    PromptFileError,
    parse_prompt_line,
    read_prompts,
)

GOOD = [
    {"prompt": "12+34="},
    {"prompt": "5+6=", "id": "q2", "params": {"threshold": 0.8}, "meta": {"answer": "11"}},
]

BAD_LINES = [
    ('{"prompt": "1+1=" "id": "x"}', "not valid JSON: Expecting ',' delimiter (column 19)"),
    ('["prompt", "1+1="]', "expected a JSON object, got array"),
    ('{"id": "a"}', 'missing required field "prompt"'),
    ('{"prompt": ""}', '"prompt" is empty; allowed: a non-empty string'),
    ('{"prompt": "   "}', '"prompt" is empty; allowed: a non-empty string'),
    ('{"prompt": 42}', '"prompt" must be a string, got integer (42)'),
    ('{"prompt": "1+1=", "id": 7}', '"id" must be a non-empty string, got integer (7)'),
    ('{"prompt": "1+1=", "id": ""}', '"id" must be a non-empty string, got an empty string'),
    ('{"prompt": "1+1=", "params": [1, 2]}', '"params" must be an object, got array ([1, 2])'),
    ('{"prompt": "1+1=", "meta": "x"}', '"meta" must be an object, got string ("x")'),
    ('{"promt": "1+1="}', 'unknown field "promt"; did you mean "prompt"? allowed fields: id, prompt, params, meta'),
]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("text,reason", BAD_LINES)
def test_each_bad_line_has_its_exact_reason(text, reason):
    item, reasons = parse_prompt_line(text, 1)
    assert item is None
    assert reason in reasons


def test_unknown_field_and_missing_prompt_are_both_reported():
    item, reasons = parse_prompt_line('{"promt": "1+1="}')
    assert reasons == [
        'unknown field "promt"; did you mean "prompt"? allowed fields: id, prompt, params, meta',
        'missing required field "prompt"',
    ]


def test_skip_keeps_good_lines_in_order_and_reports_bad_ones_by_number(tmp_path):
    lines = [json.dumps(GOOD[0]), BAD_LINES[0][0], "", json.dumps(GOOD[1]), BAD_LINES[2][0],
             json.dumps({"prompt": "7+7=", "id": "q2"})]
    path = write_lines(tmp_path / "p.jsonl", lines)
    items, problems = read_prompts(path, on_error="skip")
    assert [(i.prompt, i.id, i.line) for i in items] == [("12+34=", None, 1), ("5+6=", "q2", 4)]
    assert items[1].params == {"threshold": 0.8} and items[1].meta == {"answer": "11"}
    assert [str(p) for p in problems] == [
        "line 2: not valid JSON: Expecting ',' delimiter (column 19)",
        'line 5: missing required field "prompt"',
        'line 6: duplicate id "q2" (first on line 4)',
    ]


def test_refuse_lists_every_bad_line_and_starts_nothing(tmp_path):
    lines = [json.dumps(GOOD[0]), BAD_LINES[5][0], json.dumps(GOOD[1]), BAD_LINES[10][0]]
    path = write_lines(tmp_path / "p.jsonl", lines)
    with pytest.raises(PromptFileError) as err:
        read_prompts(path, on_error="refuse")
    assert isinstance(err.value, ParameterError)  # the CLI reports it in one line, exit status 2
    assert str(err.value) == (
        f"{path}: 2 bad lines; the job did not start (use --on-bad-line skip to run the other lines):\n"
        '  line 2: "prompt" must be a string, got integer (42)\n'
        '  line 4: unknown field "promt"; did you mean "prompt"? allowed fields: id, prompt, params, meta\n'
        '  line 4: missing required field "prompt"'
    )
    assert err.value.problems == [
        LineProblem(2, '"prompt" must be a string, got integer (42)'),
        LineProblem(4, 'unknown field "promt"; did you mean "prompt"? allowed fields: id, prompt, params, meta'),
        LineProblem(4, 'missing required field "prompt"'),
    ]


def test_bad_utf8_bom_and_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n\n   \n{"prompt": "\xff"}\n{"prompt": "b"}')
    items, problems = read_prompts(path, on_error="skip")
    assert [i.prompt for i in items] == ["a", "b"]  # the BOM is dropped; the last line needs no newline
    assert [str(p) for p in problems] == ["line 4: not valid UTF-8 (byte 0xff at column 13)"]


def test_missing_file_and_bad_mode(tmp_path):
    with pytest.raises(FileNotFoundError, match="prompt file not found: .*nope.jsonl"):
        read_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(ParameterError, match="on_error='ignore' is not allowed; allowed: one of 'skip', 'refuse'"):
        read_prompts(tmp_path / "nope.jsonl", on_error="ignore")
