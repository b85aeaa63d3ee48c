"""What a trained Trans-LoRA discriminator records about its base, by the rule every trainer follows
(`adaptkit.hub.base_provenance`): a local folder by its path, a repo read on the Hub given as `endpoint` by its id and
commit, and never a bare repo id of a folder pushed to another Hub."""
import pytest
from huggingface_hub import ModelCard

from adaptkit.hub import push_folder, read_metadata
from adaptkit.translora import Discriminator, DiscriminatorConfig, train_discriminator

REAL = [f"apple tree number {i} is green" for i in range(4)]
SYNTHETIC = [f"zero zero {i} minus minus" for i in range(4)]


def _train(base, tok, tmp_path, **kw) -> Discriminator:
    config = DiscriminatorConfig(output_dir=str(tmp_path / "work"), max_steps=1, use_cpu=True, disable_tqdm=True)
    return train_discriminator(base, tok, REAL, SYNTHETIC, config, **kw)


def _base_of(art) -> tuple:
    return art.base_model, art.base_revision, art.base_path


def test_a_discriminator_on_a_local_folder_records_the_folder(tiny_model_dir, tiny_tok, tmp_path, trainer_stamp):
    disc = _train(str(tiny_model_dir), tiny_tok, tmp_path)
    assert _base_of(disc) == (None, None, str(tiny_model_dir.resolve())) == trainer_stamp(str(tiny_model_dir))
    source = read_metadata(disc.save_pretrained(tmp_path / "disc"))["source"]
    assert (source["base_model"], source["base_path"]) == (None, str(tiny_model_dir.resolve()))
    loaded = Discriminator.from_pretrained(tmp_path / "disc")  # its base found from the folder it records
    assert loaded.base_path == str(tiny_model_dir.resolve())


@pytest.mark.parametrize("given", ["repo id", "pushed folder"])
def test_a_discriminator_on_a_repo_of_the_localhub_given_as_endpoint_records_its_id_and_commit(
        hub, tiny_model_copy, tiny_tok, tmp_path, given, trainer_stamp):
    commit = push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    base = "team/base" if given == "repo id" else str(tiny_model_copy)
    disc = _train(base, tiny_tok, tmp_path, endpoint=hub.endpoint)
    assert _base_of(disc) == ("team/base", commit, None) == trainer_stamp(base, hub.endpoint)
    assert disc.model_card("team/disc").data.base_model == "team/base"


def test_a_discriminator_card_never_names_a_repo_of_another_hub(hub, tiny_model_copy, tiny_tok, tmp_path,
                                                                trainer_stamp):
    "A folder pushed to a LocalHub, trained on without that Hub: its bare repo id would name a huggingface.co repo."
    push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    disc = _train(str(tiny_model_copy), tiny_tok, tmp_path)
    assert _base_of(disc) == (None, None, str(tiny_model_copy.resolve())) == trainer_stamp(str(tiny_model_copy))
    folder = disc.save_pretrained(tmp_path / "disc")
    assert read_metadata(folder)["source"]["base_model"] is None
    assert ModelCard.load(folder / "README.md").data.base_model is None
