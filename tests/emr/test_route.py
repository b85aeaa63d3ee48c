"""EMR when the task is unknown (issue 27 item 1): the bundle's router, checked against features and prototypes computed
independently from the bundle's files; stored with the bundle through save/load and a LocalHub push/pull, a tampered
router file refused; routed inference equal to running the routed task's model; errors before any model runs."""
import json

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import HfApi
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

from adaptkit.emr import BundleError, EMRBundle, emr_merge
from adaptkit.emr.route import ROUTER_FILE, RoutedModel, Router
from adaptkit.hub import sha256_file
from adaptkit.models import tiny_tokenizer

hf_logging.disable_progress_bar()
TOK = tiny_tokenizer()
EXAMPLES = {"words": ["the cat", "the cat sat", "a cat"], "digits": ["1 2", "1 2 1", "2 1"]}
HELD = {"words": ["the cat the", "a cat sat"], "digits": ["2 2 1", "1 1"]}
LAYER = 0  # the embeddings: words and digits share no token, so a tiny random model separates them for sure


ON_TOK = {"vocab_size": TOK.vocab_size, "pad_token_id": TOK.pad_token_id}  # classifiers that read `TOK`'s ids


@pytest.fixture
def bundle(classifier, tmp_path):
    "A bundle of two tiny Llama classifiers (3 and 2 classes) fine-tuned (perturbed) from one base."
    base = classifier(2, 0, **ON_TOK)
    tasks = {}
    for i, t in enumerate(["words", "digits"]):
        m = classifier(3 - i, i + 1, **ON_TOK)
        m.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in base.state_dict().items()
                           if k != "score.weight"}, strict=False)
        tasks[t] = m
    return emr_merge(base, tasks, out_dir=tmp_path / "bundle", progress=False)


def unified_by_hand(bundle, task, classifier):
    "The unified model from the bundle's files: base + unified for the merged tensors, the task's own head."
    base, unified = load_file(bundle.folder / "base" / "model.safetensors"), load_file(
        bundle.folder / "unified" / "model.safetensors")
    sd = {n: base[n] + unified[n] for n in unified} | load_file(bundle.folder / "tasks" / task / "own.safetensors")
    model = classifier(3 if task == "words" else 2, 99, **ON_TOK)
    model.load_state_dict(sd, strict=True)
    return model.eval()


@torch.no_grad()
def features_by_hand(model, texts, layer=-1):
    "Each text alone (no padding): the mean over its tokens of the decoder's hidden states at `layer`."
    return torch.stack([model.model(**TOK([t], return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0]
                        .mean(0) for t in texts])


def test_prototypes_and_routes_match_an_independent_computation(bundle, classifier):
    model = unified_by_hand(bundle, "words", classifier)
    got = bundle.load_unified_model("words").state_dict()
    assert set(got) == set(model.state_dict()) and all(torch.equal(got[n], v) for n, v in model.state_dict().items())
    router = bundle.fit_router(EXAMPLES, TOK, method="prototype", layer=LAYER, max_length=16, batch_size=2)
    # (padded batches of two)
    want = torch.stack([F.normalize(F.normalize(features_by_hand(model, EXAMPLES[t], LAYER), dim=-1).mean(0), dim=0)
                        for t in ("words", "digits")])
    assert router.tasks == ["words", "digits"] and torch.allclose(router.tensors["prototypes"], want, atol=1e-5)
    texts = HELD["words"] + HELD["digits"]
    cosines = F.normalize(features_by_hand(model, texts, LAYER), dim=-1) @ want.T
    by_hand = [["words", "digits"][i] for i in cosines.argmax(-1).tolist()]
    assert by_hand == ["words", "words", "digits", "digits"]  # a separable case, by the hand computation
    assert bundle.route(texts, TOK) == by_hand
    assert torch.allclose(router.scores(bundle.router_features(texts, TOK)), cosines, atol=1e-5)
    assert router.settings["feature"] == {"model": "unified", "layer": LAYER, "pooling": "mean", "normalize": "l2",
                                          "max_length": 16}


def test_the_router_travels_with_the_bundle_through_save_and_a_local_hub(bundle, hub, tmp_path):
    fingerprint = bundle._fingerprint()
    router = bundle.fit_router(EXAMPLES, TOK, method="linear", held_out=HELD, layer=LAYER, max_length=16)
    assert router.settings["held_out"] == {"accuracy": 1.0, "per_task": {"words": 1.0, "digits": 1.0},
                                           "examples": {"words": 2, "digits": 2}}
    assert not (bundle.folder / ROUTER_FILE).exists()  # in memory until saved, like `bundle.results`
    saved = bundle.save_pretrained(tmp_path / "saved")
    entry = json.loads((saved / "emr.json").read_text())["router"]
    assert entry["sha256"] == sha256_file(saved / ROUTER_FILE) == json.loads(
        (saved / "adaptkit.json").read_text())["files"][ROUTER_FILE]
    assert json.loads((saved / "adaptkit.json").read_text())["settings"]["router"] == (
        f"linear, 3 examples per task, layer {LAYER} mean-pooled, 16 tokens")
    texts = HELD["words"] + HELD["digits"]
    for again in (EMRBundle(saved), EMRBundle.from_pretrained(saved)):
        assert (again.router.method, again.router.tasks, again.router.settings) == ("linear", router.tasks,
                                                                                     router.settings)
        assert all(torch.equal(again.router.tensors[k], v) for k, v in router.tensors.items())
        assert again.route(texts, TOK) == bundle.route(texts, TOK) == ["words"] * 2 + ["digits"] * 2
        assert again._fingerprint() == fingerprint  # cached task models stay valid
    commit = EMRBundle(saved).push_to_hub("team/emr-routed", endpoint=hub.endpoint)
    pulled = EMRBundle.from_pretrained("team/emr-routed", revision=commit, endpoint=hub.endpoint)
    assert pulled.router.settings == router.settings and pulled.route(texts, TOK) == ["words"] * 2 + ["digits"] * 2
    card = HfApi(endpoint=hub.endpoint).model_info("team/emr-routed").card_data
    assert card.pipeline_tag == "text-classification"
    readme = (pulled.folder / "README.md").read_text()
    assert "a logistic-regression head" in readme and "Routing accuracy on 4 held-out examples: **1.000**" in readme
    # a new router is written anew: the saved bundle's file (hard-linked into the copy) is never written through
    before = (saved / ROUTER_FILE).read_bytes()
    again = EMRBundle(saved)
    again.fit_router(EXAMPLES, TOK, method="prototype", layer=LAYER, max_length=16)
    resaved = again.save_pretrained(tmp_path / "resaved")
    assert (saved / ROUTER_FILE).read_bytes() == before and EMRBundle(resaved).router.method == "prototype"
    again.router = None  # removed: saved without it
    bare = again.save_pretrained(tmp_path / "bare")
    assert not (bare / ROUTER_FILE).exists() and "router" not in json.loads((bare / "emr.json").read_text())
    assert EMRBundle.from_pretrained(bare).router is None and "No router is stored" in (bare / "README.md").read_text()


def flip_last_byte(path):
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10
    path.write_bytes(bytes(raw))


def test_a_tampered_router_file_is_refused(bundle, hub, tmp_path):
    bundle.fit_router(EXAMPLES, TOK, method="prototype", layer=LAYER, max_length=16)
    saved = bundle.save_pretrained(tmp_path / "saved")
    bundle.push_to_hub("team/emr-routed", endpoint=hub.endpoint)
    flip_last_byte(saved / ROUTER_FILE)
    with pytest.raises(BundleError, match=r"saved/router.safetensors: sha256 .* differs from emr.json's router entry"):
        EMRBundle(saved)
    with pytest.raises(ValueError, match=r"saved/router.safetensors: sha256 .* differs from adaptkit.json's"):
        EMRBundle.from_pretrained(saved)
    pulled = EMRBundle.from_pretrained("team/emr-routed", endpoint=hub.endpoint)
    flip_last_byte((pulled.folder / ROUTER_FILE).resolve())  # the cache's blob
    with pytest.raises(ValueError, match=r"router.safetensors: sha256 .* differs from adaptkit.json's"):
        EMRBundle.from_pretrained("team/emr-routed", endpoint=hub.endpoint)
    # emr.json's entry is checked too, field by field
    fresh = bundle.save_pretrained(tmp_path / "fresh")
    meta = json.loads((fresh / "emr.json").read_text())
    meta["router"]["tasks"] = ["digits", "words"]
    (fresh / "emr.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"fresh/emr.json: field 'router.tasks' must be the bundle's tasks "
                                          r"\['words', 'digits'\], in order, got \[\"digits\", \"words\"\]"):
        EMRBundle(fresh, verify=False)
    (fresh / ROUTER_FILE).unlink()
    meta["router"]["tasks"] = ["words", "digits"]
    (fresh / "emr.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"fresh/router.safetensors: named by emr.json's router entry, missing"):
        EMRBundle(fresh, verify=False)


def test_errors_name_what_is_wrong_before_any_model_runs(bundle, tmp_path):
    for call in (lambda: bundle.route(["the cat"], TOK), lambda: bundle.load_routed_model(TOK)):
        with pytest.raises(ValueError, match=rf"the EMR bundle {bundle.folder} has no router.*bundle.fit_router"):
            call()
    with pytest.raises(KeyError, match=rf"examples: no task 'dates' in the bundle {bundle.folder}; its tasks: words"):
        bundle.fit_router(EXAMPLES | {"dates": ["1 May", "2 June"]}, TOK)
    with pytest.raises(ValueError, match=r"examples: no examples of task 'digits'; the router must know every task"):
        bundle.fit_router({"words": EXAMPLES["words"]}, TOK)
    with pytest.raises(ValueError, match=r"examples\['digits'\]: 1 example\(s\); a router needs at least 2 per task"):
        bundle.fit_router(EXAMPLES | {"digits": ["1 2"]}, TOK)
    with pytest.raises(TypeError, match=r"examples\['words'\]: item 1 is None, expected a non-empty string"):
        bundle.fit_router(EXAMPLES | {"words": ["the cat", None]}, TOK)
    with pytest.raises(KeyError, match=r"held_out: no task 'dates'"):
        bundle.fit_router(EXAMPLES, TOK, held_out={"dates": ["3 May"]})
    with pytest.raises(ValueError, match=r"held_out\['words'\] repeats an example the router is fitted on: 'a cat'"):
        bundle.fit_router(EXAMPLES, TOK, held_out={"words": ["a cat"]})
    with pytest.raises(ValueError, match=r"router method 'knn': expected one of 'prototype', 'linear'"):
        bundle.fit_router(EXAMPLES, TOK, method="knn")
    with pytest.raises(ValueError, match=r"l2 must be a positive number, got -1"):
        bundle.fit_router(EXAMPLES, TOK, method="linear", l2=-1)
    assert bundle._unified is None and bundle.router is None  # nothing was loaded or fitted
    with pytest.raises(ValueError, match=r"layer 3 out of range: the model has 3 hidden states"):
        bundle.fit_router(EXAMPLES, TOK, layer=3)
    other = Router("prototype", ["a", "b"], {"prototypes": torch.eye(2, 16)})
    bundle.router = other
    with pytest.raises(ValueError, match=r"the router routes to tasks \['a', 'b'\], the bundle .* has \['words', "
                                         r"'digits'\]: fit it on this bundle"):
        bundle.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


def test_routed_inference_runs_each_text_through_its_task_model(bundle, tmp_path):
    bundle.fit_router(EXAMPLES, TOK, method="prototype", layer=LAYER, max_length=16)
    texts = ["1 1", "the cat the", "2 2 1", "cat sat"]
    routed = bundle.load_routed_model(TOK, max_loaded=1, cache_dir=tmp_path / "cache", batch_size=1)
    assert isinstance(routed, RoutedModel)
    outputs = routed(texts)
    assert [o.task for o in outputs] == ["digits", "words", "digits", "words"]
    models = {t: bundle.load_task_model(t).eval() for t in bundle.tasks}  # independently loaded, no cache
    with torch.no_grad():
        for text, o in zip(texts, outputs):
            want = models[o.task](**TOK([text], return_tensors="pt")).logits[0]
            assert o.logits.shape == (3 if o.task == "words" else 2,) and torch.allclose(o.logits, want, atol=1e-5)
    assert list(routed.models) == ["words"]  # one kept: the least recently used dropped
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()) == ["digits", "words"]
    assert routed.predict(texts) == [(o.task, int(o.logits.argmax())) for o in outputs]
    forced = routed.forward(texts, tasks=["words"] * 4)  # the task known: no routing
    assert [o.task for o in forced] == ["words"] * 4 and torch.allclose(forced[1].logits, outputs[1].logits, atol=1e-5)
    with pytest.raises(ValueError, match="3 tasks for 4 texts"):
        routed.forward(texts, tasks=["words"] * 3)


def test_the_router_is_bound_to_its_tokenizer_and_refuses_another_by_name(bundle, hub, tmp_path):
    "Issue 38, item 14: the router records its tokenizer; another (routing plausibly, or with ids past the model's "
    "embeddings) is refused by name before any feature is computed, never routed nor failing with an IndexError."
    from transformers import AutoTokenizer

    from adaptkit.emr.route import tokenizer_fingerprint
    TOK.save_pretrained(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")  # the tasks' tokenizer, named by its folder
    router = bundle.fit_router(EXAMPLES, tok, method="prototype", layer=LAYER, max_length=16)
    assert router.settings["tokenizer"] == tokenizer_fingerprint(tok) == {
        "name_or_path": str(tmp_path / "tok"), "vocab_size": len(TOK), "vocab_sha256": router.settings["tokenizer"][
            "vocab_sha256"]}
    texts = HELD["words"] + HELD["digits"]
    commit = bundle.push_to_hub("team/emr-routed", endpoint=hub.endpoint)
    pulled = EMRBundle.from_pretrained("team/emr-routed", revision=commit, endpoint=hub.endpoint)
    assert pulled.router.settings["tokenizer"] == router.settings["tokenizer"]  # stored with the bundle
    assert pulled.route(texts, TOK) == ["words"] * 2 + ["digits"] * 2  # the same vocabulary, in memory: accepted
    tiny_tokenizer(300).save_pretrained(tmp_path / "small")  # other ids for the same texts: routes plausibly
    TOK.save_pretrained(tmp_path / "added")
    added = AutoTokenizer.from_pretrained(tmp_path / "added")
    added.add_tokens(["zebra"])  # id 512: the models have no embedding for it (an IndexError before)
    added.save_pretrained(tmp_path / "added")
    for name in ("small", "added"):
        other = AutoTokenizer.from_pretrained(tmp_path / name)
        refused = (rf"this router was fitted with the tokenizer '{tmp_path / 'tok'}' \({len(TOK)} tokens\), but the "
                   rf"tokenizer '{tmp_path / name}' \({len(other)} tokens\) was given, with another vocabulary")
        with pytest.raises(ValueError, match=refused):
            pulled.route(texts + ["a zebra"], other)
        with pytest.raises(ValueError, match=refused):
            pulled.load_routed_model(other)
    added = AutoTokenizer.from_pretrained(tmp_path / "added")
    with pytest.raises(ValueError, match=rf"the tokenizer '{tmp_path / 'added'}' gives token id {len(TOK)}, but the "
                                         rf"model has {len(TOK)} embeddings: it is not the model's tokenizer"):
        bundle.fit_router(EXAMPLES | {"words": ["a zebra", "the zebra sat"]}, added, layer=LAYER, max_length=16)
    meta = json.loads((pulled.folder / "emr.json").read_text())
    meta["router"]["tokenizer"] = {"name_or_path": "x", "vocab_size": 0, "vocab_sha256": "0" * 64}
    (tmp_path / "copy").mkdir()
    with pytest.raises(BundleError, match=r"field 'router.tokenizer' must be"):
        Router.load(tmp_path / "copy", meta["router"], ["words", "digits"])


TASKS = ["words", "digits"]
ENTRY = {"method": "prototype", "tasks": TASKS, "file": ROUTER_FILE, "sha256": "0" * 64,
         "feature": {"layer": 0, "pooling": "mean", "max_length": 1}, "examples": {"words": 2, "digits": 2},
         "held_out": None, "tokenizer": {"name_or_path": "tok", "vocab_size": 1, "vocab_sha256": "f" * 64}}
FEATURE = "{'layer': int, 'pooling': 'mean', 'max_length': positive int, ...}"
EXAMPLES_WANT = "{task: examples (>= 2)} for every task"
TOKENIZER = "{'name_or_path': str, 'vocab_size': positive int, 'vocab_sha256': hex sha256}"


def test_a_router_entry_at_the_limits_is_accepted(tmp_path):
    # max_length 1 and 2 examples per task are the smallest valid values: the entry passes, the file is looked for
    for entry in (ENTRY, ENTRY | {"held_out": {"accuracy": 1.0}}):
        with pytest.raises(BundleError, match=f"{ROUTER_FILE}: named by emr.json's router entry, missing"):
            Router.load(tmp_path, entry, TASKS)


@pytest.mark.parametrize("field, value, want, shown", [
    ("method", "knn", "one of ['prototype', 'linear']", '"knn"'),
    ("tasks", ["digits", "words"], "the bundle's tasks ['words', 'digits'], in order", '["digits", "words"]'),
    ("file", "model.safetensors", "'router.safetensors'", '"model.safetensors"'),
    ("sha256", "abc", "a hex sha256", '"abc"'),
    ("sha256", None, "a hex sha256", "null"),
    ("feature", {"layer": 0, "pooling": "mean", "max_length": 0}, FEATURE,
     '{"layer": 0, "pooling": "mean", "max_length": 0}'),
    ("feature", {"layer": "0", "pooling": "mean", "max_length": 8}, FEATURE,
     '{"layer": "0", "pooling": "mean", "max_length": 8}'),
    ("feature", {"pooling": "mean", "max_length": 8}, FEATURE, '{"pooling": "mean", "max_length": 8}'),
    ("feature", {"layer": 0, "pooling": "max", "max_length": 8}, FEATURE,
     '{"layer": 0, "pooling": "max", "max_length": 8}'),
    ("examples", {"words": 2, "dates": 2}, EXAMPLES_WANT, '{"words": 2, "dates": 2}'),
    ("examples", {"words": 2, "digits": 1}, EXAMPLES_WANT, '{"words": 2, "digits": 1}'),
    ("examples", {"words": 2, "digits": 2.0}, EXAMPLES_WANT, '{"words": 2, "digits": 2.0}'),
    ("held_out", [], "an object or null", "[]"),
    ("tokenizer", "tok", TOKENIZER, '"tok"'),
    ("tokenizer", {"name_or_path": "tok", "vocab_size": 0, "vocab_sha256": "ff"}, TOKENIZER,
     '{"name_or_path": "tok", "vocab_size": 0, "vocab_sha256": "ff"}'),
])
def test_a_bad_router_entry_names_the_file_the_field_and_the_value(tmp_path, field, value, want, shown):
    with pytest.raises(BundleError) as e:
        Router.load(tmp_path, ENTRY | {field: value}, TASKS)
    assert str(e.value) == f"{tmp_path / 'emr.json'}: field 'router.{field}' must be {want}, got {shown}"


def test_a_router_entry_that_is_no_object_or_holds_no_json_value_is_shown(tmp_path):
    path = tmp_path / "emr.json"
    with pytest.raises(BundleError) as e:
        Router.load(tmp_path, ["prototype"], TASKS)
    assert str(e.value) == f"{path}: field 'router' must be a JSON object, got [\"prototype\"]"
    with pytest.raises(BundleError) as e:  # an entry built in Python: a Path where emr.json holds a string
        Router.load(tmp_path, ENTRY | {"file": tmp_path / ROUTER_FILE}, TASKS)
    assert str(e.value) == f"{path}: field 'router.file' must be 'router.safetensors', got \"{tmp_path / ROUTER_FILE}\""
    with pytest.raises(BundleError) as e:  # a long value is cut to its first 100 characters
        Router.load(tmp_path, ENTRY | {"sha256": "x" * 200}, TASKS)
    assert str(e.value) == f"{path}: field 'router.sha256' must be a hex sha256, got \"{'x' * 99}"


def fit_features(*widths, n=2):
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.randn(n, w, generator=g) for i, w in enumerate(widths)}


@pytest.mark.parametrize("features, error, message", [
    (fit_features(4), ValueError, "a router needs features of at least two tasks: {task: [examples, dim] tensor}"),
    ([torch.ones(2, 4), torch.ones(2, 4)], ValueError,
     "a router needs features of at least two tasks: {task: [examples, dim] tensor}"),
    (fit_features(4, 4) | {"t1": [[1.0] * 4] * 2}, TypeError,
     "task 't1': features must be a [examples, dim] tensor, got list"),
    (fit_features(4, 4) | {"t1": torch.ones(4)}, TypeError,
     "task 't1': features must be a [examples, dim] tensor, got Tensor"),
    (fit_features(4, 4) | {"t1": torch.ones(1, 4)}, ValueError,
     "task 't1': 1 example(s), a router needs at least 2 per task"),
    (fit_features(4, 4) | {"t1": torch.tensor([[0.0] * 4, [float("nan")] * 4])}, ValueError,
     "task 't1': features have NaN or Inf values"),
    (fit_features(4, 5), ValueError, "features of different widths [4, 5]: one model and layer for all"),
    (fit_features(4, 5, 5), ValueError, "features of different widths [4, 5]: one model and layer for all"),
    (fit_features(4, 5, 6), ValueError, "features of different widths [4, 5, 6]: one model and layer for all"),
])
@pytest.mark.parametrize("method", ["prototype", "linear"])
def test_router_fit_refuses_bad_features_by_task(features, error, message, method):
    with pytest.raises(error) as e:
        Router.fit(features, method=method)
    assert type(e.value) is error and str(e.value) == message


def test_router_fit_takes_two_examples_per_task_and_scores_each_input_per_task():
    features = fit_features(4, 4, 4)
    router = Router.fit(features, method="prototype")
    assert router.tasks == ["t0", "t1", "t2"] and router.settings["examples"] == {"t0": 2, "t1": 2, "t2": 2}
    x = torch.cat(list(features.values()))
    scores = router.scores(x)
    want = (x / x.norm(dim=1, keepdim=True)) @ router.tensors["prototypes"].T  # rows scaled to length 1, by hand
    assert scores.shape == (6, 3) and torch.allclose(scores, want, atol=1e-6)
    assert router.predict(x) == [router.tasks[i] for i in want.argmax(1).tolist()]
    for bad in (torch.ones(2, 5), torch.ones(4)):
        with pytest.raises(ValueError) as e:
            router.scores(bad)
        assert str(e.value) == (f"features of shape {list(bad.shape)}: this router takes [inputs, 4] (features of "
                                "another model or layer?)")


@pytest.mark.parametrize("dim, l2", [(5, 0.7), (16, 0.05)])  # the second needs more than L-BFGS's default 20 steps
def test_the_linear_router_is_the_penalised_logistic_regression_optimum(dim, l2):
    "The fit's (W, b), mapped back to the standardised features, zeroes the gradient of the objective it states: the "
    "summed cross-entropy plus l2/2 |W|^2, on columns standardised by their mean and population std."
    g = torch.Generator().manual_seed(3)
    raw = {t: torch.randn(n, dim, generator=g) + shift for t, n, shift in (("a", 3, 1), ("b", 5, 0), ("c", 4, -1))}
    for f in raw.values(): f[:, -1] = 0  # a constant column: left unscaled, its weights zero
    router = Router.fit(raw, method="linear", l2=l2)
    x = torch.cat([f / f.norm(dim=1, keepdim=True) for f in raw.values()]).double()
    y = torch.tensor([0] * 3 + [1] * 5 + [2] * 4)
    mu, sd = x.mean(0), ((x - x.mean(0)) ** 2).mean(0).sqrt()
    sd[sd == 0] = 1
    z = (x - mu) / sd
    w, b = router.tensors["weight"].double(), router.tensors["bias"].double()
    assert w.shape == (3, dim) and b.shape == (3,) and torch.all(w[:, -1] == 0)
    wz, bz = w * sd, b + w @ mu  # the same logits on z: z @ wz.T + bz == x @ w.T + b
    residual = torch.softmax(z @ wz.T + bz, 1) - F.one_hot(y, 3).double()
    grad_w, grad_b = residual.T @ z + l2 * wz, residual.sum(0)
    # 2e-6: a few times what storing (W, b) in float32 leaves
    assert grad_w.abs().max() < 2e-6 and grad_b.abs().max() < 2e-6
    assert wz.abs().max() > 0.1  # not the trivial optimum
    torch.testing.assert_close(router.scores(torch.cat(list(raw.values()))).double(), x @ w.T + b, rtol=0, atol=1e-5)
