"""Visualization helpers: attention maps and Shaw relative-embedding heatmaps on tiny random models."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("matplotlib")

from conftest import SCHEMES, tiny_model  # noqa: E402

from hf_relpos.tools.viz import (  # noqa: E402
    encoder_attentions,
    main,
    plot_attention_maps,
    plot_relative_embeddings,
    relative_similarities,
    require_matplotlib,
    save_figure,
)
from hf_relpos.translation.tokenization import train_joint_tokenizer  # noqa: E402

PNG_MAGIC = b"\x89PNG"


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_attention_maps_have_one_map_per_layer_and_head(position_scheme, tmp_path):
    model = tiny_model(position_scheme)
    model.set_attn_implementation("sdpa")
    weights = encoder_attentions(model, [5, 6, 7, 8, 9, 1])
    assert weights.shape == (2, 4, 6, 6)
    assert model.config._attn_implementation == "sdpa"  # restored after the eager call
    expected_rows = torch.ones(2, 4, 6)
    if position_scheme == "directional":
        # DiSAN with the diagonal disabled: the forward heads (0, 1) have no key for the first query, the backward
        # heads (2, 3) none for the last; those rows are zero, every other row sums to 1
        expected_rows[:, :2, 0] = 0
        expected_rows[:, 2:, -1] = 0
    assert torch.allclose(weights.sum(-1), expected_rows, atol=1e-5)
    figure = plot_attention_maps(model, [5, 6, 7, 8, 9, 1], out_path=tmp_path / "maps.png")
    assert len(figure.axes) == 2 * 4 + 1  # layers x heads, plus the colour bar
    assert (tmp_path / "maps.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("shared", [True, False])
def test_relative_embeddings_similarity_per_layer(shared, tmp_path):
    model = tiny_model("shaw", relative_embeddings_shared_across_heads=shared)
    similarities = relative_similarities(model)
    assert set(similarities) == {"w^K", "w^V"}
    tables = {"w^K": model.model.encoder.positions.relative_keys, "w^V": model.model.encoder.positions.relative_values}
    for name, similarity in similarities.items():
        assert similarity.shape == (2, 7, 7)  # layers, 2k+1, 2k+1 with k = 3
        table = tables[name].detach()
        for layer in range(2):
            heads = table[layer] if not shared else table[layer].unsqueeze(0)  # [H or 1, 2k+1, d_z]
            for distance, other in ((0, 6), (2, 3), (5, 1)):
                expected = torch.nn.functional.cosine_similarity(heads[:, distance], heads[:, other], dim=-1).mean()
                assert torch.allclose(similarity[layer, distance, other], expected, atol=1e-6)
    figure = plot_relative_embeddings(model, tmp_path / "relative.png")
    assert len(figure.axes) == 2 * 2 + 1
    assert (tmp_path / "relative.png").read_bytes().startswith(PNG_MAGIC)


def test_relative_embeddings_with_keys_only_and_without_tables():
    assert set(relative_similarities(tiny_model("shaw", use_relative_values=False))) == {"w^K"}
    with pytest.raises(ValueError, match="no learned relative tables"):
        relative_similarities(tiny_model("xl"))


@pytest.mark.parametrize("plot", [plot_attention_maps, plot_relative_embeddings])
def test_an_encoder_without_layers_is_one_error_naming_encoder_layers(plot):
    """encoder_layers 0: one ValueError (it was torch.stack's "expects a non-empty TensorList", or matplotlib's
    "Number of columns must be a positive integer")."""
    args = ([3, 4, 5],) if plot is plot_attention_maps else ()
    with pytest.raises(ValueError, match=r"^the encoder of this model has no layers \(encoder_layers 0\)"):
        plot(tiny_model("shaw", encoder_layers=0), *args)


def test_encoder_attentions_gives_each_module_its_own_mode_back():
    """It restored one flag for the whole model: a training model whose encoder's dropout had been frozen
    (`encoder.eval()`) came back with every module training; each module's own mode is restored, also on an error."""
    model = tiny_model("shaw").train()
    model.model.encoder.eval()
    modes = {name: module.training for name, module in model.named_modules()}
    encoder_attentions(model, [5, 6, 7, 1])
    assert {name: module.training for name, module in model.named_modules()} == modes
    with pytest.raises(IndexError):
        encoder_attentions(model, [model.config.vocab_size])
    assert {name: module.training for name, module in model.named_modules()} == modes


def test_command_renders_a_saved_model_with_its_tokenizer_or_token_ids(tmp_path):
    tokenizer = train_joint_tokenizer(["the dog sees the cat", "der Hund sieht die Katze"] * 5, vocab_size=296)
    model = tiny_model("shaw", vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    written = main([str(tmp_path / "model"), "--sentence", "the dog sees the cat", "--out", str(tmp_path / "a")])
    assert [path.name for path in written] == ["attention_maps.png", "relative_embeddings.png"]
    assert all(path.read_bytes().startswith(PNG_MAGIC) for path in written)

    tiny_model("directional").save_pretrained(tmp_path / "plain")
    written = main([str(tmp_path / "plain"), "--token-ids", "5", "6", "7", "1", "--out", str(tmp_path / "b")])
    assert [path.name for path in written] == ["attention_maps.png"]
    with pytest.raises(SystemExit):
        main([str(tmp_path / "plain"), "--sentence", "no tokenizer here", "--out", str(tmp_path / "c")])


@pytest.mark.parametrize("out", ["file", "dangling"])
def test_an_out_that_is_a_file_or_a_dangling_link_is_one_error_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                                    out):
    """Was a FileExistsError traceback (exit status 1) from `mkdir`, after loading the model."""
    (tmp_path / "file").write_text("kept\n")
    (tmp_path / "dangling").symlink_to("missing")
    monkeypatch.setattr("transformers.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before checking --out"))
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "model"), "--token-ids", "5", "--out", str(tmp_path / out)])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: python -m hf_relpos.tools.viz ") and "Traceback" not in error
    assert error.splitlines()[-1].startswith(f"python -m hf_relpos.tools.viz: error: argument --out: the folder "
                                             f"'{tmp_path / out}': ")
    assert (tmp_path / "file").read_text() == "kept\n" and (tmp_path / "dangling").is_symlink()


def test_a_folder_the_command_cannot_plot_or_ids_outside_the_vocabulary_are_one_error_before_writing(tmp_path,
                                                                                                   capsys):
    """Each was a traceback (exit status 1): a missing folder a Hub lookup's OSError, a MarianMT or BART folder an
    AttributeError (no position_scheme) once `--out` was made, ids outside the vocabulary torch's `index out of range
    in self`."""
    from transformers import BartConfig, BartForConditionalGeneration

    tiny_model("shaw").save_pretrained(tmp_path / "model")
    shutil.copytree(tmp_path / "model", tmp_path / "corrupt")
    weights = tmp_path / "corrupt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])   # as a kill while saving leaves it
    BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                            decoder_ffn_dim=32)).save_pretrained(tmp_path / "bart")
    cases = [
        ([str(tmp_path / "missing"), "--token-ids", "5"],
         f"model_dir '{tmp_path / 'missing'}': no such folder (the nearest existing folder is '{tmp_path}'); a Hub model "
         "id has the form owner/name"),
        ([str(tmp_path / "corrupt"), "--token-ids", "5"],
         f"model_dir '{tmp_path / 'corrupt'}': its weights file is cut short or corrupt (Error while deserializing header: "
         "invalid header length)"),
        ([str(tmp_path / "bart"), "--token-ids", "5"],
         f"model_dir '{tmp_path / 'bart'}' holds a 'bart' model; this command plots hf_relpos models "
         "('relpos_transformer')"),
        ([str(tmp_path / "model"), "--token-ids", "5", "40", "-1"],
         "--token-ids must be ids in [0, 40) (the model's vocab_size), got [40, -1]"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--out", str(tmp_path / "out")])
        assert exited.value.code == 2
        error = capsys.readouterr().err
        assert "Traceback" not in error and error.splitlines()[-1] == f"python -m hf_relpos.tools.viz: error: {message}"
        assert not (tmp_path / "out").exists()


def test_missing_matplotlib_is_one_error_naming_the_viz_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing matplotlib now raises ImportError
    with pytest.raises(ImportError, match=r"the optional `viz` extra: pip install '\.\[train,viz\]'"):
        require_matplotlib()
    with pytest.raises(ImportError, match=r"the optional `viz` extra: pip install '\.\[train,viz\]'"):
        plot_relative_embeddings(tiny_model("shaw"))


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_a_figure_is_saved_whole_or_not_at_all(tmp_path, suffix, monkeypatch):
    """`save_figure` writes the format of the path's suffix and replaces the file in one step: a write that fails
    part-way (a kill, a full disk) leaves the previous image and no temporary file."""
    import matplotlib.pyplot as plt

    figure = plt.figure()
    path = tmp_path / f"map{suffix}"
    save_figure(figure, path, dpi=50)
    first = path.read_bytes()
    assert first.startswith(PNG_MAGIC if suffix == ".png" else b"%PDF")

    def cut_short(target, **kwargs):
        Path(target).write_bytes(first[:10])
        raise OSError("No space left on device")

    monkeypatch.setattr(figure, "savefig", cut_short)
    with pytest.raises(OSError, match="No space left"):
        save_figure(figure, path, dpi=50)
    assert path.read_bytes() == first and [item.name for item in tmp_path.iterdir()] == [path.name]
    plt.close(figure)


def test_a_figure_path_without_a_suffix_is_saved_as_matplotlib_saves_it(tmp_path):
    """As `figure.savefig` does: a path without a suffix gets the format `savefig.format` (PNG) and its extension,
    and no temporary file is left."""
    import matplotlib.pyplot as plt

    figure = plt.figure()
    save_figure(figure, tmp_path / "map", dpi=50)
    plt.close(figure)
    assert [item.name for item in tmp_path.iterdir()] == ["map.png"]
    assert (tmp_path / "map.png").read_bytes().startswith(PNG_MAGIC)
