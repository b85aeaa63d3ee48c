"""Aligner across modules: train on a Q-A-C file, push with its card to a LocalHub, pull by repo id and correct;
bad rows are refused before training."""
import json
import re

import datasets
import pytest
from huggingface_hub import HfApi

from adaptkit.aligner import (
    ALIGNER_QAC_TEMPLATE,
    ALIGNER_V1_TEMPLATE,
    METHOD,
    AlignedPolicy,
    Aligner,
    AlignerConfig,
    AlignerTrainer,
    aligner_rows,
    check_template,
    dpo_rounds,
    format_aligner_prompt,
    preference_pairs,
)
from adaptkit.data import DataError
from adaptkit.hub import push_folder
from adaptkit.models import load_tokenizer, tiny_causal_lm


def _qac_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_push_pull_correct(hub, tiny_model_dir, tiny_model_copy, tmp_path):
    rows = [
        {"question": f"What is {i} times 2?", "answer": f"{i}", "correction": f"{i} times 2 is {2 * i}."}
        for i in range(8)
    ]
    tok = load_tokenizer(tiny_model_dir)
    args = AlignerConfig(
        str(tmp_path / "run"),
        template=ALIGNER_QAC_TEMPLATE,
        identity_warmup_ratio=0.25,
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    trainer = AlignerTrainer("team/base", args, _qac_file(tmp_path / "qac.jsonl", rows), processing_class=tok,
                             hub_endpoint=hub.endpoint)
    assert trainer.base_model == "team/base"
    trainer.train()
    art = trainer.artifact()
    art.results = [{"task": "text-generation", "dataset": "tiny-times", "metric": "accuracy", "value": 0.0}]
    art.datasets = ["tiny-times"]
    out = art.save_pretrained(tmp_path / "aligner")
    commit = push_folder(out, "team/tiny-aligner", endpoint=hub.endpoint)
    data = HfApi(endpoint=hub.endpoint).model_info("team/tiny-aligner").card_data
    assert (data.base_model, data.datasets) == ("team/base", ["tiny-times"])
    assert "aligner" in data.tags and data.eval_results[0].metric_value == 0.0
    aligner = Aligner.from_pretrained("team/tiny-aligner", endpoint=hub.endpoint, revision=commit)
    assert aligner.template == ALIGNER_QAC_TEMPLATE  # the template travels with the aligner
    local = Aligner.from_pretrained(out)
    qs, ans = [r["question"] for r in rows[:3]], [r["answer"] for r in rows[:3]]
    assert aligner.correct(qs, ans, max_new_tokens=5) == local.correct(qs, ans, max_new_tokens=5)


@pytest.mark.parametrize("bad, message", [
    ({"question": "q", "answer": "a"}, "row 1, column 'correction': missing value (null)"),
    ({"question": "q", "answer": "", "correction": "c"}, "row 1, column 'answer': empty text"),
    ({"question": "q", "answer": "a", "correction": 3}, "row 1, column 'correction': expected str, got int"),
])
def test_bad_rows_are_refused_before_training(tiny_model_dir, tmp_path, bad, message):
    good = {"question": "q0", "answer": "a0", "correction": "c0"}
    args = AlignerConfig(str(tmp_path / "run"), max_steps=1, use_cpu=True, report_to="none")
    with pytest.raises(DataError, match=re.escape(message)):
        AlignerTrainer(str(tiny_model_dir), args, _qac_file(tmp_path / "bad.jsonl", [good, bad]),
                       processing_class=load_tokenizer(tiny_model_dir))


# --- the template, token for token, in training and at inference (a non-default template, so ignoring it fails) ---

CUSTOM = "<<Q>> {question} <<A>> {answer} <<FIX>>:"
ROWS = [{"question": "What is 2 + 3?", "answer": "-4 maybe", "correction": "-2 + 3 is 1."},
        {"question": "What is 7 - 1?", "answer": "6", "correction": "7 - 1 = 6."}]


def _prompt_ids(tok, template, row):
    return tok(template.format(question=row["question"], answer=row["answer"]), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("identity", [False, True])
def test_aligner_rows_hold_the_template_token_for_token(tiny_tok, identity):
    out = aligner_rows(datasets.Dataset.from_list(ROWS), CUSTOM, tiny_tok, identity=identity)
    assert out.column_names == ["input_ids", "labels"]
    for row, enc in zip(ROWS, out):
        prompt = _prompt_ids(tiny_tok, CUSTOM, row)
        n = len(prompt)
        # the prompt, untrained, as at inference
        assert enc["input_ids"][:n] == prompt and enc["labels"][:n] == [-100] * n
        target = tiny_tok(row["answer"] if identity else row["correction"], add_special_tokens=False)["input_ids"]
        assert enc["input_ids"][n:] == target + [tiny_tok.eos_token_id] == enc["labels"][n:]


def test_trainer_rows_use_the_configured_template(tiny_model_dir, tiny_tok, tmp_path):
    args = AlignerConfig(str(tmp_path / "run"), template=CUSTOM, identity_warmup_ratio=0.5, max_steps=1, use_cpu=True)
    trainer = AlignerTrainer(str(tiny_model_dir), args, ROWS, processing_class=tiny_tok)
    for data in (trainer.train_dataset, trainer.warmup):
        for enc in data:
            starts = [
                enc["input_ids"][: len(_prompt_ids(tiny_tok, CUSTOM, r))] == _prompt_ids(tiny_tok, CUSTOM, r)
                for r in ROWS
            ]
            assert any(starts), tiny_tok.decode(enc["input_ids"])


def test_correct_feeds_the_model_its_own_template_token_for_token(tiny_tok):
    aligner = Aligner(tiny_causal_lm(tiny_tok), tiny_tok, CUSTOM)
    seen, generate = [], aligner.model.generate
    def recording_generate(input_ids, attention_mask, **kw):
        seen.extend(ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask))
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kw)
    aligner.model.generate = recording_generate
    out = aligner.correct([r["question"] for r in ROWS], [r["answer"] for r in ROWS], max_new_tokens=2)
    assert len(out) == 2 and seen == [_prompt_ids(tiny_tok, CUSTOM, r) for r in ROWS]


def test_correct_runs_the_template_opening_once_and_changes_no_correction(tiny_tok):
    "The V1 template's text up to 'harmless:' runs once, first and alone; every correction is the pair's own."
    aligner = Aligner(tiny_causal_lm(tiny_tok, hidden_size=64), tiny_tok)  # one whose corrections differ
    qs = ["What is 2 + 3?", "Why?", "what is six plus two, and why is it not seven or nine?", "7 - 1"]
    answers = ["-4 maybe", "because", "eight", "6, I think, or maybe five"]
    opening = ALIGNER_V1_TEMPLATE.split("{question}")[0].rstrip()  # the space before a question joins its first word
    assert opening.endswith("harmless:")
    n = len(tiny_tok(opening, add_special_tokens=False)["input_ids"])
    shapes = []
    hook = aligner.model.register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try: got = aligner.correct(qs, answers, batch_size=3, max_new_tokens=6)
    finally: hook.remove()
    longest = max(len(tiny_tok(format_aligner_prompt(q, a), add_special_tokens=False)["input_ids"])
                  for q, a in zip(qs, answers))
    assert shapes[0] == (1, n) and all(tokens < longest - n for _, tokens in shapes[1:])  # no pass runs it again
    alone = [aligner.correct([q], [a], max_new_tokens=6, share_prefix=False)[0] for q, a in zip(qs, answers)]
    assert got == alone and len(set(alone)) == 3  # distinct: a mix-up of rows would show
    assert aligner.correct(qs, answers, batch_size=3, max_new_tokens=6, share_prefix=False) == alone

def test_training_prompt_equals_inference_prompt_on_a_merging_boundary(tiny_tok, tiny_model_dir, tmp_path):
    "A correction starting with '-' after a template ending on ':' : the ids before the answer stay the prompt's own."
    row = ROWS[0]
    aligner = Aligner(tiny_causal_lm(tiny_tok), tiny_tok)
    seen = []
    generate = aligner.model.generate
    aligner.model.generate = lambda input_ids, **kw: (
        seen.append(input_ids[0].tolist()) or generate(input_ids=input_ids, **kw)
    )
    aligner.correct([row["question"]], [row["answer"]], max_new_tokens=1)
    enc = aligner_rows(datasets.Dataset.from_list([row]), ALIGNER_V1_TEMPLATE, tiny_tok)[0]
    assert enc["input_ids"][:len(seen[0])] == seen[0] and enc["labels"][len(seen[0])] != -100


# --- the template an aligner loads with ---

def test_template_fallbacks(tiny_tok, tmp_path, caplog):
    plain = tmp_path / "plain"
    tiny_causal_lm(tiny_tok).save_pretrained(plain); tiny_tok.save_pretrained(plain)
    with caplog.at_level("WARNING", logger="adaptkit.aligner"):
        assert Aligner.from_pretrained(plain).template == ALIGNER_V1_TEMPLATE
    assert "records no template" in caplog.text
    config_only = tmp_path / "config-only"  # trained elsewhere, but the config knows its template
    model = tiny_causal_lm(tiny_tok); model.config.aligner_template = CUSTOM
    model.save_pretrained(config_only); tiny_tok.save_pretrained(config_only)
    caplog.clear()
    assert Aligner.from_pretrained(config_only).template == CUSTOM and "records no template" not in caplog.text
    saved = tmp_path / "saved"
    Aligner(tiny_causal_lm(tiny_tok), tiny_tok, CUSTOM).save_pretrained(saved)
    assert json.loads((saved / "adaptkit.json").read_text())["aligner"]["template"] == CUSTOM
    assert Aligner.from_pretrained(saved).template == CUSTOM


# --- dpo_rounds(push_to=...) against a LocalHub ---

def test_dpo_rounds_push_each_round_tagged(hub, tiny_tok, tmp_path):
    import torch
    from trl import DPOConfig

    policy, aligner = tiny_causal_lm(tiny_tok, seed=3), Aligner(tiny_causal_lm(tiny_tok, seed=1), tiny_tok, CUSTOM)
    args = DPOConfig(str(tmp_path / "dpo"), beta=0.02, learning_rate=1e-3, max_steps=1, per_device_train_batch_size=2,
                     report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, bf16=False)
    trained = dpo_rounds(
        policy,
        tiny_tok,
        aligner,
        ["What is 1 + 1?", "What is 2 + 2?", "Name a colour."],
        rounds=2,
        args=args,
        push_to="team/policy",
        hub_endpoint=hub.endpoint,
        base_model="team/base",
        max_new_tokens=4,
    )
    metrics = trained.rounds
    assert [m["round"] for m in metrics] == [1, 2] and all(m["pairs"] > 0 for m in metrics)
    api = HfApi(endpoint=hub.endpoint)
    tags = {t.name: t.target_commit for t in api.list_repo_refs("team/policy").tags}
    assert (
        tags == {"round-1": metrics[0]["commit"], "round-2": metrics[1]["commit"]}
        and metrics[0]["commit"] != metrics[1]["commit"]
    )
    pulled = AlignedPolicy.from_pretrained("team/policy", endpoint=hub.endpoint, revision="round-2")
    assert pulled.settings["round"] == 2 and pulled.settings["pairs"] == metrics[1]["pairs"]
    pulled_weights, trained_weights = pulled.model.state_dict().values(), trained.model.state_dict().values()
    assert all(torch.equal(a, b) for a, b in zip(pulled_weights, trained_weights))
    assert trained.settings["round"] == 2
    card = api.model_info("team/policy", revision="round-1").card_data
    assert card.base_model == "team/base" and "aligner" in card.tags


def test_dpo_rounds_policy_records_the_model_it_started_from_and_how_it_was_trained(hub, tiny_tok, tiny_model_copy,
                                                                                   tmp_path):
    "No base_model given: the repo and commit the policy was pulled at, by the trainers' rule; its batch and precision."
    from trl import DPOConfig

    from adaptkit.models import load_causal_lm

    class Corrected(Aligner):
        def correct(self, questions, answers, **kwargs): return [a + " (corrected)" for a in answers]

    base_commit = push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    policy = load_causal_lm("team/base", endpoint=hub.endpoint)  # its name_or_path: the snapshot of team/base
    args = DPOConfig(str(tmp_path / "dpo"), max_steps=1, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, bf16=False)
    trained = dpo_rounds(policy, tiny_tok, Corrected(tiny_causal_lm(tiny_tok), tiny_tok), ["1 + 1?", "2 + 2?"],
                         rounds=1, args=args, push_to="team/policy", hub_endpoint=hub.endpoint, max_new_tokens=3)
    assert (trained.base_model, trained.base_revision, trained.base_path) == ("team/base", base_commit, None)
    card = HfApi(endpoint=hub.endpoint).model_info("team/policy").card_data
    assert card.base_model == "team/base"
    pulled = AlignedPolicy.from_pretrained("team/policy", endpoint=hub.endpoint)
    assert (pulled.base_model, pulled.base_revision) == ("team/base", base_commit)
    made = {"num_processes": 1, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
            "total_train_batch_size": 4, "precision": "fp32"}
    assert {k: pulled.settings.get(k) for k in made} == made == {k: trained.settings[k] for k in made}


def test_dpo_rounds_answers_and_trains_on_the_conversation(tiny_tok, tmp_path, monkeypatch):
    "A prompt with a system line: the policy answers and DPO trains under it; the aligner gets the question alone."
    from trl import DPOConfig

    seen, rendered = [], []

    class Recording(Aligner):
        def correct(self, questions, answers, **kwargs):
            seen.append(list(questions))
            return [a + " (fixed)" for a in answers]

    render = tiny_tok.apply_chat_template
    def recording_render(messages, *args, **kwargs):
        rendered.append((len(seen), messages))  # (corrections made so far: 0 while answering, 1 in DPO, messages)
        return render(messages, *args, **kwargs)
    monkeypatch.setattr(tiny_tok, "apply_chat_template", recording_render)

    system = {"role": "system", "content": "Answer with the number only."}
    prompts = [[system, {"role": "user", "content": "What is 1 + 1?"}], "Name a colour."]
    args = DPOConfig(str(tmp_path / "dpo"), beta=0.02, learning_rate=1e-3, max_steps=1, per_device_train_batch_size=2,
                     report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, bf16=False)
    trained = dpo_rounds(tiny_causal_lm(tiny_tok, seed=3), tiny_tok, Recording(tiny_causal_lm(tiny_tok), tiny_tok),
                         prompts, rounds=1, args=args, max_new_tokens=4, progress=False)
    assert seen == [["What is 1 + 1?", "Name a colour."]] and trained.rounds[0]["pairs"] == 2
    with_system = lambda messages: any(m == system for m in messages if isinstance(m, dict))
    assert any(with_system(m) for n, m in rendered if n == 0)  # the policy answered under the system line
    assert any(with_system(m) for n, m in rendered if n == 1)  # and DPO trained under it
    with pytest.raises(ValueError, match="must end with a user message"):
        dpo_rounds(trained.model, tiny_tok, Recording(tiny_causal_lm(tiny_tok), tiny_tok), [[system]], rounds=1)


# --- the card: TRL's hooks on the trainer, the method declared once ---

def test_the_card_reads_the_trainers_trl_hooks(tiny_model_dir, tiny_tok, tmp_path):
    "TRL's `_name`, `_paper` and `_tag_names` are what the card says: a subclass that changes them changes its card."
    from huggingface_hub import ModelCard

    class HouseTrainer(AlignerTrainer):
        _tag_names, _name = [*AlignerTrainer._tag_names, "house-style"], "House Aligner"

    assert (AlignerTrainer._name, AlignerTrainer._paper) == (METHOD.name, METHOD.paper) == (
        "Aligner", {"title": "Aligner: Efficient Alignment by Learning to Correct", "id": "2402.02416"})
    args = AlignerConfig(str(tmp_path / "run"), max_steps=1, use_cpu=True, identity_warmup_ratio=0.0)
    trainer = HouseTrainer(str(tiny_model_dir), args, ROWS, processing_class=tiny_tok)
    trainer.save_model()
    card = ModelCard.load(tmp_path / "run" / "README.md")
    assert ("using **House Aligner** ([Aligner: Efficient Alignment by Learning to Correct]"
            "(https://arxiv.org/abs/2402.02416)") in card.text
    assert card.data.tags == ["adaptkit", "aligner", "arxiv:2402.02416", "house-style"]
    trainer.create_model_card(dataset_name="me/qac", tags="extra")  # what `trainer.push_to_hub(...)` passes on
    card = ModelCard.load(tmp_path / "run" / "README.md")
    assert card.data.datasets == ["me/qac"] and card.data.tags[-2:] == ["house-style", "extra"]
    assert "using **Aligner**" in str(Aligner.from_pretrained(tmp_path / "run").model_card())  # the artifact: METHOD


# --- every input check: its error type and the name it reports ---

@pytest.mark.parametrize("kwargs, error, name", [
    ({"identity_warmup_ratio": 1.0}, ValueError, "identity_warmup_ratio"),
    ({"identity_warmup_ratio": -0.1}, ValueError, "identity_warmup_ratio"),
    ({"template": "{question} only"}, ValueError, "missing {answer}"),
    ({"template": "{answer} only"}, ValueError, "missing {question}"),
    ({"template": "{question} {answer} {lang}"}, ValueError, "'lang'"),
    ({"template": 3}, TypeError, "template must be a str"),
])
def test_config_checks(kwargs, error, name):
    with pytest.raises(error, match=re.escape(name)):
        AlignerConfig("x", **kwargs)


def test_aligner_and_rows_checks(tiny_tok, tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=re.escape("missing {question}")):
        Aligner(tiny_causal_lm(tiny_tok), tiny_tok, "{answer}")
    with pytest.raises(ValueError, match=re.escape("missing {answer}")):
        aligner_rows(datasets.Dataset.from_list(ROWS), "{question}", tiny_tok)
    with pytest.raises(ValueError, match=re.escape("row 1: the prompt takes")):
        aligner_rows(
            datasets.Dataset.from_list([ROWS[1], {**ROWS[0], "question": "long " * 200}]),
            CUSTOM,
            tiny_tok,
            max_length=64,
        )
    aligner = Aligner(tiny_causal_lm(tiny_tok), tiny_tok, CUSTOM)
    with pytest.raises(ValueError, match="2 questions but 1 answers"):
        aligner.correct(["a", "b"], ["x"])
    with pytest.raises(TypeError, match="questions must be a list"):
        aligner.correct("a", "x")
    with pytest.raises(TypeError, match="answers must be a list"):
        aligner.correct(["a"], "x")
    with pytest.raises(ValueError, match="needs its tokenizer"):
        aligner.stack(tiny_causal_lm(tiny_tok))
    with pytest.raises(ValueError, match="lengths differ: 1 prompts, 0 answers, 1 corrections"):
        preference_pairs(["p"], [], ["c"])
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        dpo_rounds(tiny_causal_lm(tiny_tok), tiny_tok, aligner, ["q"], rounds=0)
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        dpo_rounds(tiny_causal_lm(tiny_tok), tiny_tok, aligner, [])
    with pytest.raises(ValueError, match="needs processing_class"):
        AlignerTrainer(tiny_causal_lm(tiny_tok), AlignerConfig(str(tmp_path / "r"), max_steps=1, use_cpu=True), ROWS)
    args = AlignerConfig(str(tmp_path / "r"), template=CUSTOM, max_steps=1, use_cpu=True, max_length=64)
    with pytest.raises(ValueError, match=re.escape("row 1: the prompt takes")):  # before any training
        AlignerTrainer(
            str(tiny_model_dir), args, [ROWS[1], {**ROWS[0], "question": "long " * 200}], processing_class=tiny_tok
        )


def test_trainer_finds_the_tokenizer_beside_a_folder_model(tiny_model_dir, tmp_path):
    args = AlignerConfig(str(tmp_path / "r"), max_steps=1, use_cpu=True, identity_warmup_ratio=0.0)
    trainer = AlignerTrainer(str(tiny_model_dir), args, ROWS)
    assert trainer.processing_class.eos_token == "<|im_end|>" and len(trainer.train_dataset) == 2



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.

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


def test_dpo_round_pairs_are_the_same_on_every_rank_with_sampled_decoding(tiny_tok, monkeypatch):
    """Two ranks, simulated by two threads with accelerate's split and gather: each answers its half of the prompts
    with sampling, and both build the same pairs, in the prompts' order (each rank answering every prompt with its own
    samples would give each rank other pairs, and DPO's sampler would mix rows of different datasets)."""
    import threading

    from accelerate import PartialState

    from adaptkit.aligner import dpo

    local, parts, barrier = threading.local(), {}, threading.Barrier(2, timeout=600)

    class TwoRanks:  # what `PartialState()` is on rank `local.rank` of two
        num_processes = 2
        split_between_processes = PartialState.split_between_processes
        @property
        def process_index(self): return local.rank

    def gather(obj):  # accelerate's `gather_object`: every rank's list, in rank order, on every rank
        parts[local.rank] = obj
        barrier.wait()
        return [x for rank in (0, 1) for x in parts[rank]]

    class Marking(Aligner):  # every answer makes a pair
        def correct(self, questions, answers, **kwargs): return [f"{a} (corrected)" for a in answers]

    asked, lock, answer = {0: [], 1: []}, threading.Lock(), dpo.chat_answers
    def recording(model, tok, prompts, **kwargs):  # one thread generates at a time: they share the model object
        asked[local.rank] += list(prompts)
        with lock: return answer(model, tok, prompts, **kwargs)

    monkeypatch.setattr(dpo, "PartialState", TwoRanks)
    monkeypatch.setattr(dpo, "gather_object", gather)
    monkeypatch.setattr(dpo, "chat_answers", recording)
    policy, aligner = tiny_causal_lm(tiny_tok, seed=3), Marking(tiny_causal_lm(tiny_tok), tiny_tok)
    prompts = [f"What is {i} plus {i}?" for i in range(6)]
    pairs, errors = {}, []
    def rank(r):
        local.rank = r
        try: pairs[r] = dpo._round_pairs(policy, tiny_tok, aligner, prompts, prompts, do_sample=True,
                                         max_new_tokens=6, progress=False).to_list()
        except BaseException as e: errors.append(e); barrier.abort()
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    assert asked == {0: prompts[:3], 1: prompts[3:]}  # each prompt answered once, by one rank
    assert pairs[0] == pairs[1] and len(pairs[0]) == 6
    assert [p["prompt"][-1]["content"] for p in pairs[0]] == prompts


def test_a_merged_aligner_is_written_in_shards_and_a_tampered_shard_is_refused(tiny_tok, tmp_path):
    "An aligner trained with a LoRA is saved merged, in transformers' shards at `max_shard_size`, each checksummed."
    import torch
    from peft import LoraConfig, get_peft_model

    from adaptkit.hub import read_metadata
    lora = get_peft_model(tiny_causal_lm(tiny_tok), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    aligner = Aligner(lora, tiny_tok, CUSTOM)
    limit = max(t.nbytes for t in tiny_causal_lm(tiny_tok).parameters())
    aligner.save_pretrained(tmp_path / "a", max_shard_size=limit)
    shards = sorted(p.name for p in (tmp_path / "a").glob("model-*-of-*.safetensors"))
    assert len(shards) > 3 and (tmp_path / "a" / "model.safetensors.index.json").is_file()
    assert set(shards) <= set(read_metadata(tmp_path / "a")["files"])
    loaded = Aligner.from_pretrained(tmp_path / "a")
    assert loaded.template == CUSTOM and not any("lora_" in k for k in loaded.model.state_dict())
    ids = tiny_tok(["2 + 2 ="], return_tensors="pt")
    assert torch.allclose(loaded.model(**ids).logits, lora(**ids).logits, atol=1e-5)
    (tmp_path / "a" / shards[0]).write_bytes((tmp_path / "a" / shards[0]).read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match=re.escape(shards[0])):
        Aligner.from_pretrained(tmp_path / "a")
