"""The byte-level masked-LM CPU base trains as the Linformer authors train (RoBERTa's optimiser: no gradient
clipping), and with its defaults a Linformer learns to use context in its 600 steps. The run takes about a minute
on one idle core: ``slow``."""

import pytest

from training import config as run_config
from training.train import train

LEFT = 0.15  # nats below the no-context level on the masked targets: a run that left the plateau


def test_the_masked_lm_bases_clip_no_gradient_as_the_authors_recipe():
    for name in ("bytes_mlm.yaml", "paper_mlm.yaml"):
        assert run_config.load(run_config.CONFIG_DIR / name).optim.gradient_clip_val == 0.0, name


@pytest.mark.slow
def test_with_its_defaults_the_byte_base_trains_a_linformer_that_uses_its_context(tmp_path):
    cfg = run_config.load(
        run_config.CONFIG_DIR / "bytes_mlm.yaml", ["seed=0", "trainer.cpu_threads=1", f"run_dir={tmp_path / 'run'}"]
    )
    assert cfg.model.attention.kind == "linformer"
    metrics = train(cfg)
    gain = metrics["baselines"]["unigram/masked_loss"] - metrics["val/masked_loss"]
    assert gain >= LEFT, metrics["val/masked_loss"]
