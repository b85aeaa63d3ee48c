"""The `adaptkit` command: every recipe in recipes/ runs at tiny scale through a LocalHub with the stock client
pulling what it pushed; `hub push|pull` record commits; the console script is installed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import HfApi
from peft import PeftModel
from transformers import BertConfig, BertForSequenceClassification

from adaptkit.cli import COMMANDS, main, parser_for
from adaptkit.emr.merge import EMRBundle
from adaptkit.hub import pull, push_folder
from adaptkit.models import load_causal_lm

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY_TRAIN = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--use_cpu", "true", "--disable_tqdm", "true",
              "--report_to", "none"]


def run(argv, capsys) -> dict:
    "Run the command in-process; its printed JSON result."
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_recipe_names_a_command_and_only_its_fields():
    "A recipe with a typo'd key fails in TrlParser; this catches it without training anything."
    names = {p.stem for p in RECIPES.glob("*.yaml")}
    assert {"pissa", "aligner", "emr"} <= names
    for path in RECIPES.glob("*.yaml"):
        parser, keys = parser_for(path.stem), yaml.safe_load(path.read_text())
        assert not parser.set_defaults_with_config(**keys), f"{path.name}: keys no {path.stem} option reads"


def test_pissa_recipe_pushes_a_plain_lora(hub, tiny_model_dir, tiny_model_copy, tmp_path, capsys):
    commit = push_folder(tiny_model_copy, "team/tiny", endpoint=hub.endpoint)  # a push records itself in the folder
    data = jsonl(
        tmp_path / "train.jsonl", [{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(8)]
    )
    res = run(
        [
            "pissa",
            "--config",
            RECIPES / "pissa.yaml",
            "--model_name_or_path",
            "team/tiny",
            "--dataset_name",
            data,
            "--pissa_r",
            "4",
            "--pissa_alpha",
            "4",
            "--pissa_niter",
            "2",
            "--output_dir",
            tmp_path / "out",
            *TINY_TRAIN,
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "team/tiny-pissa",
            "--hub_endpoint",
            hub.endpoint,
        ],
        capsys,
    )
    assert res["repo_id"] == "team/tiny-pissa" and res["steps"] == 2
    assert json.loads((Path(res["adapter"]) / "adapter_config.json").read_text())["r"] == 8  # saved locally too
    info = HfApi(endpoint=hub.endpoint).model_info("team/tiny-pissa")
    assert info.sha == res["commit"] and info.card_data.base_model == "team/tiny"
    adapter = pull("team/tiny-pissa", revision=res["commit"], endpoint=hub.endpoint)
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8  # 2r: the plain-LoRA form
    assert commit in (adapter / "README.md").read_text()  # the base's commit, pinned
    ids = torch.tensor([[1, 2, 3]])
    model = PeftModel.from_pretrained(load_causal_lm("team/tiny", endpoint=hub.endpoint), adapter)
    local = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir), res["adapter"])
    assert torch.equal(model(ids).logits, local(ids).logits)  # the pushed adapter is the one saved locally
    base = load_causal_lm(tiny_model_dir)(ids).logits
    assert torch.isfinite(base).all() and not torch.allclose(model(ids).logits, base)  # and it changes the base


def test_aligner_recipe_with_lora_saves_template(tiny_model_dir, tmp_path, capsys):
    rows = [{"question": f"what is {i} plus {i}?", "answer": f"{i}", "correction": f"{2 * i}"} for i in range(10)]
    res = run(["aligner", "--config", RECIPES / "aligner.yaml", "--model_name_or_path", tiny_model_dir,
               "--dataset_name", jsonl(tmp_path / "qac.jsonl", rows), "--lora_r", "2", "--lora_alpha", "4",
               "--output_dir", tmp_path / "out", *TINY_TRAIN], capsys)
    assert res["warmup_rows"] == 2 and Path(res["aligner"]).is_dir()
    from adaptkit.aligner import ALIGNER_V1_TEMPLATE, Aligner
    assert Aligner.from_pretrained(res["aligner"]).template == ALIGNER_V1_TEMPLATE


def test_repnoise_recipe_saves_a_defended_model_with_card(tiny_model_dir, tmp_path, capsys):
    rows = [
        {"prompt": f"how do I do bad thing {i}?", "harmful": f"step {i}: do it", "harmless": "I can't help with that."}
        for i in range(6)
    ]
    res = run(
        [
            "repnoise",
            "--config",
            RECIPES / "repnoise.yaml",
            "--model_name_or_path",
            tiny_model_dir,
            "--max_length",
            "32",
            "--dataset_name",
            jsonl(tmp_path / "pairs.jsonl", rows),
            "--output_dir",
            tmp_path / "out",
            *TINY_TRAIN,
        ],
        capsys,
    )
    card = (Path(res["model"]) / "README.md").read_text()
    assert "repnoise" in card and "beta" in card and (Path(res["model"]) / "model.safetensors").exists()


def test_translora_recipe_moves_a_lora(tiny_model_dir, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    from adaptkit.models import load_causal_lm as load
    get_peft_model(
        load(tiny_model_dir), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    ).save_pretrained(tmp_path / "lora")
    seeds = jsonl(
        tmp_path / "seeds.jsonl", [{"prompt": f"what is {a} plus {a}?", "completion": f" {2 * a}"} for a in range(5)]
    )
    res = run(
        [
            "translora",
            "--config",
            RECIPES / "translora.yaml",
            "--source_base",
            tiny_model_dir,
            "--source_adapter",
            tmp_path / "lora",
            "--target_base",
            tiny_model_dir,
            "--seeds",
            seeds,
            "--output_dir",
            tmp_path / "run",
            "--adapter_dir",
            tmp_path / "out",
            "--num_synthetic",
            "4",
            "--prompt_max_new_tokens",
            "6",
            "--completion_max_new_tokens",
            "4",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "2",
            "--lora_target_modules",
            "q_proj",
            "--lora_r",
            "2",
            "--use_cpu",
            "true",
        ],
        capsys,
    )
    assert res["seeds"] == 5 and res["kept_fraction"] == 1.0
    assert Path(res["adapter"]) == tmp_path / "out" and (tmp_path / "out" / "adapter_config.json").exists()
    assert json.loads((tmp_path / "out" / "adaptkit.json").read_text())["artifact"] == "translora-adapter"


@pytest.mark.parametrize("argv, message", [
    (["pissa", "--model_name_or_path", "{model}", "--dataset_name", "data/missing.jsonl", "--output_dir", "{out}"],
     "data/missing.jsonl"),
    (["aligner", "--model_name_or_path", "{tmp}/no-model", "--dataset_name", "{qac}", "--output_dir", "{out}"],
     "no-model"),
    (["emr", "--pretrained", "{tmp}/no-base", "--finetuned", "a={tmp}/no-a", "b={tmp}/no-b", "--output_dir", "{out}"],
     "no-base"),
    (["hub", "push", "--folder", "{tmp}/no-folder", "--repo_id", "me/x", "--hub_endpoint", "{hub}"], "no-folder"),
    (["hub", "pull", "--repo_id", "me/does-not-exist", "--hub_endpoint", "{hub}"], "me/does-not-exist"),
    (["repnoise", "--model_name_or_path", "{model}", "--dataset_name", "{qac}", "--output_dir", "{out}"],
     "missing column"),
    (["pissa", "--config", "{tmp}/missing-recipe.yaml"], "missing-recipe.yaml"),
])
def test_user_errors_are_one_line_and_exit_2(argv, message, hub, tiny_model_dir, tmp_path, capsys):
    "Each bad input ends in one line on stderr naming it, exit code 2, no traceback, nothing written."
    qac = jsonl(tmp_path / "qac.jsonl", [{"question": "q", "answer": "a", "correction": "c"}])
    fill = dict(model=tiny_model_dir, out=tmp_path / "out", tmp=tmp_path, qac=qac, hub=hub.endpoint)
    code = main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(NotADirectoryError, match="no-folder: not a folder to push"):
        main(["hub", "push", "--folder", str(tmp_path / "no-folder"), "--repo_id", "me/x", "--debug"])


def test_bad_rows_fail_before_training(tiny_model_dir, tmp_path, capsys):
    bad = jsonl(tmp_path / "qac.jsonl", [{"question": "q", "answer": "a", "correction": ""}])
    code = main(["aligner", "--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(bad),
                 "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "row 0, column 'correction': empty text" in err
    assert not (tmp_path / "out").exists()


def tiny_classifier(seed: int, labels: int = 2) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
            num_labels=labels,
        )
    )


def test_emr_recipe_merges_repo_ids_and_pushes_a_bundle(hub, tmp_path, capsys):
    base = tiny_classifier(0)
    base.save_pretrained(tmp_path / "base")
    push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    for i, task in enumerate(["a", "b"]):
        ft = tiny_classifier(0, labels=2 + i)
        with torch.no_grad():
            for p in ft.bert.parameters(): p.add_(0.01 * torch.randn_like(p))
        ft.save_pretrained(tmp_path / task)
        push_folder(tmp_path / task, f"team/{task}", endpoint=hub.endpoint)
    res = run(
        [
            "emr",
            "--config",
            RECIPES / "emr.yaml",
            "--pretrained",
            "team/base",
            "--finetuned",
            "a=team/a",
            "b=team/b",
            "--output_dir",
            tmp_path / "bundle",
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "team/merged",
            "--hub_endpoint",
            hub.endpoint,
        ],
        capsys,
    )
    assert res["tasks"] == ["a", "b"] and res["repo_id"] == "team/merged"
    bundle = EMRBundle.from_pretrained("team/merged", revision=res["commit"], endpoint=hub.endpoint)
    assert bundle.load_task_model("b").config.num_labels == 3


def test_hub_push_and_pull_print_commits(hub, tiny_model_copy, tmp_path, capsys):
    pushed = run(
        ["hub", "push", "--folder", tiny_model_copy, "--repo_id", "team/x", "--hub_endpoint", hub.endpoint], capsys
    )
    pulled = run(["hub", "pull", "--repo_id", "team/x", "--hub_endpoint", hub.endpoint], capsys)
    assert pulled["commit"] == pushed["commit"] and (Path(pulled["folder"]) / "config.json").exists()
    assert main(["hub", "pull", "--hub_endpoint", hub.endpoint]) == 2
    assert "missing --repo_id" in capsys.readouterr().err


def test_console_script_lists_every_command():
    exe = Path(sys.executable).parent / "adaptkit"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for name in COMMANDS: assert name in out.stdout


def test_hub_serve_subprocess_with_a_token_file(tmp_path):
    "`adaptkit hub serve` as its own process, the token from a file (never in argv): the stock client pushes with it."
    import socket
    import time

    from huggingface_hub.errors import HfHubHTTPError
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    (tmp_path / "token").write_text("hf_secret_from_file\n")
    exe = Path(sys.executable).parent / "adaptkit"
    proc = subprocess.Popen(
        [
            str(exe),
            "hub",
            "serve",
            "--root",
            str(tmp_path / "root"),
            "--port",
            str(port),
            "--token_file",
            str(tmp_path / "token"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        api = HfApi(endpoint=endpoint, token="hf_secret_from_file")
        for _ in range(300):  # until the server listens
            try: socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
            except OSError: time.sleep(0.1)
        (tmp_path / "f").mkdir(); (tmp_path / "f" / "a.txt").write_text("hi")
        commit = push_folder(tmp_path / "f", "me/x", endpoint=endpoint, token="hf_secret_from_file")
        assert api.model_info("me/x").sha == commit
        with pytest.raises(HfHubHTTPError):
            push_folder(tmp_path / "f", "me/y", endpoint=endpoint, token="wrong")
    finally:
        proc.terminate(); proc.wait(timeout=30)
    assert "hf_secret_from_file" not in " ".join(proc.args)


def test_refused_token_and_wrong_base_are_user_errors(tmp_path, capsys):
    "A token the Hub refuses, and task models that do not fit their base: one line each, exit 2."
    from adaptkit.localhub.server import LocalHub
    (tmp_path / "f").mkdir(); (tmp_path / "f" / "a.txt").write_text("hi")
    with LocalHub(tmp_path / "hub", token="hf_right_token") as hub:
        code = main(
            [
                "hub",
                "push",
                "--folder",
                str(tmp_path / "f"),
                "--repo_id",
                "me/x",
                "--hub_endpoint",
                hub.endpoint,
                "--token",
                "hf_wrong_token",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err and "hf_wrong_token" not in err, err
    tiny_classifier(0).save_pretrained(tmp_path / "base")
    for i, task in enumerate(["a", "b"]):
        other = BertForSequenceClassification(
            BertConfig(
                vocab_size=64,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=32,
            )
        )
        other.save_pretrained(tmp_path / task)
    capsys.readouterr()  # (the saves' progress bars)
    code = main(
        [
            "emr",
            "--pretrained",
            str(tmp_path / "base"),
            "--finetuned",
            f"a={tmp_path / 'a'}",
            f"b={tmp_path / 'b'}",
            "--output_dir",
            str(tmp_path / "bundle"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "hidden_size" in err, err
    assert not (tmp_path / "bundle").exists()


# --- `adaptkit <command> --help` from the stored texts: fast, the same as the parsers print, never stale -------------

REGENERATE = "stale adaptkit/cli_help.json: run `make help-texts` (the notebooks changed a command's source)"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_stored_help_was_built_from_adaptkits_current_source(name):
    "Upstream-independent: a notebook edit to a command's modules without `make help-texts` fails here, by file."
    from adaptkit.cli import _help_file, _help_sources, help_key
    entry = json.loads(_help_file().read_text())[name]
    assert entry["sources"] == help_key(_help_sources(name))["sources"], REGENERATE


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_is_what_the_parser_prints(name):
    "The stored text while its versions are the installed ones (the lock's); after upstream drift, the parser's."
    from adaptkit.cli import _help_file, command_help, help_key, help_text, stored_help
    entry = json.loads(_help_file().read_text())[name]
    if entry["versions"] == help_key([])["versions"]: assert stored_help(name) == help_text(name), REGENERATE
    else: assert stored_help(name) is None and command_help(name) == help_text(name)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_lists_every_field_of_the_commands_dataclasses(name):
    import dataclasses
    import re

    from adaptkit.cli import command_help
    usage = command_help(name).split("\n\n")[0]  # argparse's usage block names every option once
    flags = {f.replace("-", "_") for f in re.findall(r"\[?--([\w-]+)", usage)}
    fields = {f.name: f for dc in COMMANDS[name].dataclasses() for f in dataclasses.fields(dc) if f.init}
    negated = {f"no_{n}" for n, f in fields.items() if f.type in (bool, "bool") and f.default is True}
    assert flags - negated == set(fields), (sorted(flags - negated - set(fields)), sorted(set(fields) - flags))


def test_help_imports_nothing_heavy():
    "A bare `--help` answers from the stored text, or after upstream drift from the user's cache, without torch."
    from adaptkit.cli import command_help
    expected = command_help("pissa")  # stored, or built once and cached (the tests' own ADAPTKIT_CACHE)
    code = ("import sys; from adaptkit.cli import main; code = main(['pissa', '--help']); "
            "print(code, sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout == expected + "0 []\n", out.stderr[-2000:]


def _help_file_built_with(tmp_path, monkeypatch, **versions) -> Path:
    "A stored help file whose `hub pull` text says 'stale' and was built with `versions` (others as installed)."
    import adaptkit.cli
    path = adaptkit.cli.write_help_texts(tmp_path / "cli_help.json")
    entries = json.loads(path.read_text())
    entries["hub pull"] |= {"text": "stale", "versions": entries["hub pull"]["versions"] | versions}
    path.write_text(json.dumps(entries))
    monkeypatch.setattr(adaptkit.cli, "_help_file", lambda: path)
    return path


def test_help_after_upstream_drift_is_the_parsers_and_is_cached(tmp_path, monkeypatch, capsys):
    import adaptkit.cli
    _help_file_built_with(tmp_path, monkeypatch, transformers="4.0.0")
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    assert main(["hub", "pull", "--help"]) == 0
    assert capsys.readouterr().out == adaptkit.cli.help_text("hub pull")
    [cached] = (tmp_path / "cache" / "cli_help").glob("hub-pull-*.txt")
    monkeypatch.setattr(adaptkit.cli, "help_text", lambda name: pytest.fail("the cached text was not used"))
    assert main(["hub", "pull", "--help"]) == 0 and capsys.readouterr().out == cached.read_text()


def test_help_with_an_unwritable_cache_still_prints_the_parsers_text(tmp_path, monkeypatch, capsys):
    import adaptkit.cli
    _help_file_built_with(tmp_path, monkeypatch, peft="0.0.1")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "file"))  # a file where the cache folder should be
    assert main(["hub", "pull", "--help"]) == 0
    assert capsys.readouterr().out == adaptkit.cli.help_text("hub pull")


def test_help_without_the_stored_file_builds_the_parser(monkeypatch, tmp_path, capsys):
    import adaptkit.cli
    monkeypatch.setattr(adaptkit.cli, "_help_file", lambda: tmp_path / "missing.json")
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    assert main(["hub", "serve", "--help"]) == 0
    assert capsys.readouterr().out == adaptkit.cli.help_text("hub serve")
    assert adaptkit.cli.write_help_texts(tmp_path / "h.json") == tmp_path / "h.json"
    assert json.loads((tmp_path / "h.json").read_text())["hub serve"]["text"] == adaptkit.cli.help_text("hub serve")


@pytest.mark.parametrize("argv, code, stream, part", [
    ([], 0, "out", "usage: adaptkit <command>"),
    (["--help"], 0, "out", "commands:\n  pissa"),
    (["bogus"], 2, "err", "usage: adaptkit <command>"),
    (["hub"], 2, "err", "  hub serve"),
])
def test_cli_usage_for_no_or_an_unknown_command(capsys, argv, code, stream, part):
    from adaptkit.cli import main
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert part in (out if stream == "out" else err) and not (err if stream == "out" else out)


@pytest.mark.parametrize("args, message", [
    (["--finetuned", "a"], "--finetuned 'a': expected task=folder_or_repo_id"),
    (["--finetuned", "=x"], "--finetuned '=x': expected task=folder_or_repo_id"),
    (["--finetuned", "a="], "--finetuned 'a=': expected task=folder_or_repo_id"),
    (["--finetuned", "a=x", "a=y"], "--finetuned: task 'a' given twice"),
    (["--finetuned", "a=x", "--push_to_hub", "true"], "--push_to_hub needs --hub_model_id (namespace/name)"),
])
def test_cli_emr_arguments_are_checked_before_any_work(capsys, tmp_path, args, message):
    from adaptkit.cli import main
    assert main(["emr", "--pretrained", str(tmp_path / "none"), "--output_dir", str(tmp_path / "out"), *args]) == 2
    assert capsys.readouterr().err == f"adaptkit emr: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_cli_merge_runs_a_mergekit_yaml_given_first_as_mergekit_yaml_takes_it(hub, tmp_path, capsys, tiny_finetunes):
    "`adaptkit merge merge.yml --output_dir out` (the file first, as `mergekit-yaml` takes it), then a push."
    from adaptkit.emr.merge import MergedModel, merge_from_config
    tiny_finetunes(tmp_path, 2)
    cfg = {"merge_method": "dare_ties", "base_model": str(tmp_path / "base"),
           "models": [{"model": str(tmp_path / f"ft{i}"), "parameters": {"weight": 1.0, "density": 0.5}}
                      for i in range(2)], "parameters": {"normalize": True}}
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(cfg))
    out = run(["merge", tmp_path / "merge.yml", "--output_dir", tmp_path / "out", "--seed", "3", "--hub_endpoint",
               hub.endpoint, "--push_to_hub", "true", "--hub_model_id", "me/merged"], capsys)
    assert (out["method"], out["tasks"], out["repo_id"]) == ("dare_ties", ["ft0", "ft1"], "me/merged")
    got = MergedModel.from_pretrained(tmp_path / "out")
    want = merge_from_config(tmp_path / "merge.yml", seed=3, progress=False)
    pulled = MergedModel.from_pretrained("me/merged", endpoint=hub.endpoint)
    for name, t in want.state_dict.items():
        assert torch.equal(got.state_dict[name], t) and torch.equal(pulled.state_dict[name], t), name
    assert main(["merge", str(tmp_path / "merge.yml"), "--output_dir", str(tmp_path / "o2"), "--seed", "4"]) == 0
    other = MergedModel.from_pretrained(tmp_path / "o2")
    assert any(not torch.equal(other.state_dict[n], t) for n, t in want.state_dict.items())  # the seed is used


def test_cli_merge_names_an_unsupported_mergekit_field_before_any_work(tmp_path, capsys):
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(
        {"merge_method": "ties", "base_model": "/nowhere", "tokenizer_source": "union",
         "models": [{"model": "/a", "parameters": {"weight": 1}}, {"model": "/b", "parameters": {"weight": 1}}]}))
    assert main(["merge", str(tmp_path / "merge.yml"), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptkit merge: error:") and "tokenizer_source" in err
    assert not (tmp_path / "out").exists()
    assert main(["merge", "--output_dir", str(tmp_path / "out")]) == 2
    assert "missing --merge_config" in capsys.readouterr().err


@pytest.fixture
def merge_inputs(tmp_path):
    "A tiny Llama base with its tokenizer and two fine-tuned copies as folders, and a TIES YAML: the YAML's path."
    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    base = tiny_causal_lm(num_layers=2)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    for i in range(2):
        g = torch.Generator().manual_seed(i + 1)
        m = tiny_causal_lm(num_layers=2)
        m.load_state_dict({k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in base.state_dict().items()})
        m.save_pretrained(tmp_path / f"ft{i}")
    cfg = {"merge_method": "ties", "base_model": str(tmp_path / "base"),
           "models": [{"model": str(tmp_path / f"ft{i}"), "parameters": {"weight": 1.0, "density": 0.5}}
                      for i in range(2)]}
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "merge.yml"


def test_cli_merge_writes_shards_that_stock_transformers_loads(merge_inputs, tmp_path, capsys):
    "Issue 37, items 1 and 4: `--max_shard_size` shards at the root, with config, tokenizer and card beside them."
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptkit.emr.merge import merge_from_config
    out = tmp_path / "out"
    res = run(["merge", merge_inputs, "--output_dir", out, "--max_shard_size", "70KB"], capsys)
    assert (res["method"], res["tasks"]) == ("ties", ["ft0", "ft1"])
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (out / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    want = merge_from_config(merge_inputs, progress=False)
    assert all(torch.equal(p, want.state_dict[n]) for n, p in model.state_dict().items())
    assert AutoTokenizer.from_pretrained(out)("a b")["input_ids"] == AutoTokenizer.from_pretrained(
        tmp_path / "base")("a b")["input_ids"]
    card = (out / "README.md").read_text()
    assert "merged with TIES from 2 task models fine-tuned from one base (base): `ft0` (ft0), `ft1` (ft1)" in card


def test_cli_merge_dry_run_prints_the_plan_and_writes_nothing(merge_inputs, tmp_path, capsys):
    from adaptkit.tensorfiles import TensorFiles, nbytes
    res = run(["merge", merge_inputs, "--output_dir", tmp_path / "out", "--dry-run", "--max_shard_size", "70KB"],
              capsys)
    specs = TensorFiles.of_folder(tmp_path / "base").specs
    model_bytes = sum(nbytes(s) for s in specs.values())
    assert res["dry_run"] and (res["method"], res["base"], res["models"]) == ("ties", "base",
                                                                              {"ft0": "ft0", "ft1": "ft1"})
    assert (res["bytes_to_read"], res["bytes_to_write"]) == (3 * model_bytes, model_bytes)
    assert res["merged_tensors"] == len(specs) and res["shards"] >= 3
    assert res["bytes_of_inputs"] == res["bytes_to_read"] and "ties reads each tensor once" in res["reads"]
    assert not (tmp_path / "out").exists()


def test_cli_merge_reads_a_plain_number_as_bytes_and_refuses_an_invalid_size(merge_inputs, tmp_path, capsys):
    """Issue 48: `--max_shard_size 32768` is bytes (below the 65,536-byte embeddings: a shard each, as transformers
    cuts them); issue 49: `--max_shard_size=-5GB` is invalid, said before anything is read."""
    from adaptkit.emr.merge import plan_merge_config
    res = run(["merge", merge_inputs, "--output_dir", tmp_path / "out", "--dry-run", "--max_shard_size", "32768"],
              capsys)
    assert res["shards"] == plan_merge_config(merge_inputs, max_shard_size=32768)["shards"] > 3
    run(["merge", merge_inputs, "--output_dir", tmp_path / "out", "--max_shard_size", "32768"], capsys)
    assert len(list((tmp_path / "out").glob("model-*.safetensors"))) == res["shards"]
    assert main(["merge", str(merge_inputs), "--output_dir", str(tmp_path / "bad"), "--max_shard_size=-5GB"]) == 2
    err = capsys.readouterr().err
    assert "max_shard_size '-5GB' is invalid" in err and "below tensor" not in err and not (tmp_path / "bad").exists()


def test_cli_merge_dry_run_counts_the_passes_ties_makes_over_a_large_tensor(merge_inputs, tmp_path, capsys,
                                                                              monkeypatch):
    "Issue 37: TIES reads a tensor that streams in chunks 3 times (2 radix-selection passes, then the merge)."
    import math

    import adaptkit.emr.stream as stream
    from adaptkit.tensorfiles import TensorFiles, nbytes
    monkeypatch.setattr(stream, "_MERGE_CHUNK", 1000)  # the tiny model's larger tensors stream in chunks
    specs = TensorFiles.of_folder(tmp_path / "base").specs
    big = sum(nbytes(s) for s in specs.values() if math.prod(s[1]) > 1000)
    res = run(["merge", merge_inputs, "--output_dir", tmp_path / "out", "--dry-run"], capsys)
    assert res["bytes_to_read"] == res["bytes_of_inputs"] + 3 * 2 * big  # 3 models, 2 passes more over each
    assert big and "read 3 times: once per selection pass, then to merge" in res["reads"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("weight: 1.0", "weight: 1.0e+39", 1), "models[0].parameters: weight must be a finite number"),
    (lambda t: t.replace("weight: 1.0", "weight: abc", 1), "models[0].parameters: weight must be a finite number, got "
                                                          "'abc'"),
    (lambda t: t + "merge_method: linear\n", "merge_method is given twice (lines"),
    (lambda t: t.replace("/ft1", "/ft9"), "model of task 'ft9': no local folder"),
])
def test_cli_merge_refuses_a_bad_yaml_before_any_model_is_read(merge_inputs, tmp_path, capsys, monkeypatch, edit,
                                                                message):
    "Issue 38, items 9 and 11, and issue 37, item 4: the configuration checked whole, first."
    import adaptkit.emr.inputs as inputs
    monkeypatch.setattr(inputs, "_open_source", lambda *a, **k: pytest.fail("a model was opened"))
    merge_inputs.write_text(edit(merge_inputs.read_text()))
    assert main(["merge", str(merge_inputs), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptkit merge: error:") and message in err, err
    assert not (tmp_path / "out").exists()
