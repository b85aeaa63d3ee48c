"""`RepNoiseTrainer` and `disable_tqdm`: quiet when asked (no bar, no printed log dicts), its metrics still logged."""
import torch
from transformers import PrinterCallback, ProgressCallback

from adaptkit.models import tiny_causal_lm
from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer

torch.set_num_threads(2)
ROWS = [{"prompt": f"how do I do task {i}", "harmful": f"here is how to do it {i}", "harmless": "sorry I cannot help"}
        for i in range(4)]
PARTS = {"repnoise/harmless_ce", "repnoise/noise_mmd", "repnoise/harmful_ce"}


def _trainer(tmp_path, tok, disable_tqdm):
    args = RepNoiseConfig(str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3,
                          warmup_steps=0, logging_steps=1, save_strategy="no", use_cpu=True, max_length=48,
                          report_to=[], disable_tqdm=disable_tqdm)
    return RepNoiseTrainer(tiny_causal_lm(tok, num_layers=2), args, ROWS, processing_class=tok)


def _callbacks(trainer):
    return {type(c) for c in trainer.callback_handler.callbacks}


def test_disable_tqdm_prints_nothing_and_keeps_the_metrics(tiny_tok, tmp_path, capsys):
    trainer = _trainer(tmp_path, tiny_tok, disable_tqdm=True)
    assert not {PrinterCallback, ProgressCallback} & _callbacks(trainer)
    trainer.train()
    out = capsys.readouterr()
    assert "repnoise/" not in out.out + out.err and "'loss'" not in out.out  # stock Trainer prints each log dict
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(PARTS <= set(h) for h in logs)


def test_progress_bar_kept_without_disable_tqdm(tiny_tok, tmp_path):
    trainer = _trainer(tmp_path, tiny_tok, disable_tqdm=False)
    assert ProgressCallback in _callbacks(trainer) and PrinterCallback not in _callbacks(trainer)
