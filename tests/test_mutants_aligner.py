"""adaptkit.aligner's template functions, as mutation testing (`make mutation`, tests/mutation.json) asked: the exact
prompt of the default template, every message of `check_template`, and `aligner_rows` truncating only when asked."""
import re

import datasets
import pytest

from adaptkit.aligner.trainer import (
    ALIGNER_QAC_TEMPLATE,
    ALIGNER_V1_TEMPLATE,
    aligner_rows,
    check_template,
    format_aligner_prompt,
)


def test_the_default_template_is_aligner_v1_word_for_word():
    assert format_aligner_prompt("Is it safe?", "Yes.") == (
        "BEGINNING OF CONVERSATION: USER: Edit the following Question-Answer pair to make it more helpful "
        "and harmless: Is it safe? | Yes. ASSISTANT:")
    assert format_aligner_prompt("q", "a", ALIGNER_QAC_TEMPLATE) == (
        "BEGINNING OF CONVERSATION: USER: ##Question: q\n##Answer: a\n##Correction:  ASSISTANT:")
    assert format_aligner_prompt("{answer}", "{question}", "[{question}|{answer}]") == "[{answer}|{question}]"


@pytest.mark.parametrize("template", [ALIGNER_V1_TEMPLATE, "{answer} then {question}",
                                      "{{literal}} {question} {answer}",
                                      "{question} {answer} ({question:.10}, {answer:>5})"])  # specs take str values
def test_check_template_returns_a_good_template_itself(template):
    assert check_template(template) is template


@pytest.mark.parametrize("template, error, message", [
    (3, TypeError, "template must be a str, got int"),
    (None, TypeError, "template must be a str, got NoneType"),
    ("plain", ValueError, "template must contain {question} and {answer}; missing {question}, {answer}: 'plain'"),
    ("Q: {question}", ValueError, "template must contain {question} and {answer}; missing {answer}: 'Q: {question}'"),
    ("{question} {answer} {lang}", ValueError, "template has a field other than {question} and {answer} "
                                               "(KeyError('lang'); write a literal brace as {{ }}): "
                                               "'{question} {answer} {lang}'"),
    ("{question} {answer} {0}", ValueError, "template has a field other than {question} and {answer} (IndexError("),
    ("{question} {answer} {", ValueError, "template has a field other than {question} and {answer} (ValueError("),
])
def test_check_template_names_what_is_wrong(template, error, message):
    with pytest.raises(error, match=re.escape(message)):
        check_template(template)


def test_aligner_rows_truncate_only_to_a_given_max_length(tiny_tok):
    rows = datasets.Dataset.from_list([{"question": "q", "answer": "a", "correction": "a long correction " * 40}])
    template = "{question} {answer}:"
    prompt = tiny_tok(template.format(question="q", answer="a"), add_special_tokens=False)["input_ids"]
    target = tiny_tok(rows[0]["correction"], add_special_tokens=False)["input_ids"] + [tiny_tok.eos_token_id]
    full = aligner_rows(rows, template, tiny_tok)[0]
    assert full["input_ids"] == prompt + target and full["labels"] == [-100] * len(prompt) + target
    cut = aligner_rows(rows, template, tiny_tok, max_length=len(prompt) + 3)[0]
    assert cut["input_ids"] == prompt + target[:3] and cut["labels"] == [-100] * len(prompt) + target[:3]
    with pytest.raises(ValueError, match=re.escape(f"row 0: the prompt takes {len(prompt)} tokens")):
        aligner_rows(rows, template, tiny_tok, max_length=len(prompt))
