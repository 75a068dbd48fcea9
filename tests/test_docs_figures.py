"""The figures of README.md and docs/ are the committed records' (docs/results/), rendered by experiments/report.py."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every page: its measured figures must all sit in generated passages (docs/archive/ is history, kept as written).
CHECKED_PAGES = ["README.md", *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md"))]
# What the check's pattern takes for a figure but is a setting: the data filter's warning threshold, and the example
# warning it prints (training.md), the same threshold in reliability.md's table, a goal (results.md).
THRESHOLDS = {"docs/training.md": ["10 %", "10 %", "97.0%"], "docs/reliability.md": ["10 %"],
              "docs/results.md": ["70 %", "70 %"]}   # results.md: the long-input goal (5b, 6)
# A measured figure: a percentage, a speed ratio or a BLEU score.
MEASURED = re.compile(r"\d+(?:\.\d+)?\s?%|\b\d+\.\d+x\b|\b\d+(?:\.\d+)?\s?BLEU\b|\bBLEU\s\d+(?:\.\d+)?")
PASSAGE = re.compile(r"<!-- generated: (?P<name>[a-z0-9_]+) -->\n.*?<!-- end: (?P=name) -->", re.DOTALL)


def load_report(path: Path, name: str):
    """experiments/report.py at `path`, imported as module `name` (registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report():
    return load_report(ROOT / "experiments" / "report.py", "report")


def test_every_generated_passage_matches_its_records(report):
    assert report.stale_passages() == [], "run: python experiments/report.py"


def test_the_check_fails_when_a_figure_and_its_record_disagree(report, tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quality = re.search(r"<!-- generated: readme_quality -->\n.*?<!-- end: readme_quality -->", readme, re.DOTALL)
    xl_row = next(line for line in quality.group().splitlines() if line.startswith("| `xl` |"))
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace(xl_row, xl_row.replace("33.", "34.", 1)), encoding="utf-8")
    assert report.stale_passages([edited]) == [f"{edited}: readme_quality"]
    assert report.render(edited.read_text(encoding="utf-8"), {}, "README.md") == readme


def test_an_unknown_passage_is_an_error(report):
    with pytest.raises(SystemExit, match="'nonesuch'"):
        report.render("<!-- generated: nonesuch -->\n<!-- end: nonesuch -->", {}, "page.md")


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_measured_figures_appear_only_in_generated_passages(page):
    text = PASSAGE.sub("", (ROOT / page).read_text(encoding="utf-8"))
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    assert MEASURED.findall(text) == THRESHOLDS.get(page, [])


def test_every_passage_name_is_rendered_somewhere(report):
    used = {match["name"] for path in report.DOCUMENTS for match in PASSAGE.finditer(path.read_text(encoding="utf-8"))}
    assert used == set(report.PASSAGES)


def overlaps(a: list[float], b: list[float]) -> bool:
    return min(a) <= max(b) and min(b) <= max(a)


def test_the_readme_recommendation_holds_in_the_records(report):
    """README 'Which scheme', claim by claim, against the records it names: directional the one scheme beyond
    absolute's seed spread both as a recipe (one commit, equal budget) and after 20 epochs (one commit), then ahead
    of the peer trained as the recipes, at about absolute's GPU speed; xl beyond absolute in Marian's setting (the only
    one) and as its present recipe (within directional's and rope's spread), slower on the GPU, behind absolute
    after 20 epochs with attention dropout 0; rope beyond absolute as a recipe, level after 20 epochs; shaw nowhere beyond
    absolute and the slowest; alibi, t5, none trailing; what it does not support: directional overlapping absolute
    in Marian's setting, the peer overlapping absolute as recipes at the equal budget."""
    schemes = report.read("vs_marian/eight_schemes_three_seeds/vs_marian.json")["rows"]
    equal = {scheme: schemes[row]["test_bleu"] for scheme, row in report.EQUAL_BUDGET_ROWS.items()}
    one_commit = report.read(report.ONE_COMMIT)["rows"]
    recipe = {scheme: one_commit[report.ONE_COMMIT_RECIPE_ROWS.get(scheme, scheme)]["test_bleu"]
              for scheme in ("absolute", "shaw", "xl", "directional", "rope")}
    peer_recipe = one_commit[report.vs_marian.PEER_WITH_RECIPE_TOKENIZER_ROW]["test_bleu"]
    converged_record = report.read(report.TWENTY_EPOCHS_ONE_COMMIT)["systems"]
    converged = {system: row["averaged_test_bleu"] for system, row in converged_record.items()}
    speed = {scheme: [row["ratio"] for row in report.h100_model_rows(scheme)] for scheme in report.SCHEMES}

    def beyond(column: dict, scheme: str) -> bool:
        return min(column[scheme]) > max(column["absolute"])

    assert beyond(recipe, "directional") and beyond(converged, "directional")
    assert [scheme for scheme in recipe if scheme != "absolute" and beyond(recipe, scheme) and
            scheme in converged and beyond(converged, scheme)] == ["directional"]
    assert min(converged["directional"]) > max(converged["peer+recipe-training"])
    assert min(speed["directional"]) >= 0.95
    assert beyond(equal, "xl") and beyond(recipe, "xl")
    assert [scheme for scheme in equal if scheme != "absolute" and beyond(equal, scheme)] == ["xl"]
    assert overlaps(recipe["xl"], recipe["directional"]) and overlaps(recipe["xl"], recipe["rope"])
    assert max(speed["xl"]) < min(speed["directional"]) - 0.1
    assert max(converged["xl"]) < min(converged["absolute"])
    assert beyond(recipe, "rope") and overlaps(converged["rope"], converged["absolute"])
    for column in (equal, recipe, converged):
        assert not beyond(column, "shaw")
    # the slowest of the schemes measured (a scheme added since, with no GPU record yet, has no ratios)
    assert all(speed["shaw"][index] == min(ratios[index] for scheme, ratios in speed.items()
                                           if scheme != "absolute" and ratios)
               for index in range(len(speed["shaw"])))
    for scheme in ("alibi", "t5", "none"):
        assert statistics.mean(equal[scheme]) < statistics.mean(equal["absolute"]), scheme
    assert overlaps(equal["directional"], equal["absolute"]) and overlaps(peer_recipe, recipe["absolute"])
    assert overlaps(converged["shaw"], converged["absolute"])



def test_the_set_by_set_statements_hold_in_the_records(report):
    """README and docs/results.md, 'Which sets chose which settings' and the recommendation: on validation `rope` is
    beyond absolute's seed spread in both one-commit records (on test2016 directional alone is), after 20 epochs on
    validation beyond it and directional beyond the peer trained as the recipes; the length pools beat the corpus-wide
    sort beyond the spread on test2016 and within it on validation; the one-commit `absolute` rows repeat the runs
    that chose the pools; the rule gives the default on the columns of each set alone."""
    def column(path: str, split: str, weights: str = report.TRAINED_WEIGHTS) -> dict:
        return report.bleu_by_system(path, split, weights)

    for split in ("test", "validation"):
        recipe = column(report.ONE_COMMIT, split)
        converged = column(report.TWENTY_EPOCHS_ONE_COMMIT, split, "averaged")
        both = [scheme for scheme in ("shaw", "directional", "rope")
                if min(recipe[scheme]) > max(recipe["absolute"]) and min(converged[scheme]) > max(converged["absolute"])]
        assert both == (["directional"] if split == "test" else ["directional", "rope"]), split
        assert min(converged["directional"]) > max(converged[convergence_peer(report)]), split
    pooled = report.read("vs_marian/pooled_token_batches/vs_marian.json")["rows"]["matched+pooled-1280-token-batches"]
    sorted_ = report.read("vs_marian/single_factors_three_seeds/vs_marian.json")["rows"]["matched+token-batches"]
    assert min(pooled["test_bleu"]) > max(sorted_["test_bleu"])
    assert overlaps(pooled["validation_bleu"], sorted_["validation_bleu"])
    one_commit_absolute = report.read(report.ONE_COMMIT)["rows"]["absolute"]
    assert all(one_commit_absolute[key] == pooled[key] for key in ("test_bleu", "validation_bleu"))
    columns = report.default_rule_columns()
    choice, _ = report.choose_default(columns)
    for name in report.RULE_SETS:
        assert report.outcome_on_one_set(columns, name).startswith(f"**`{choice}`**"), name
    assert "Each set alone gives the outcome of both." in report.readme_default_rule()


def convergence_peer(report) -> str:
    return report.convergence.PEER_AS_RECIPE

def test_the_default_position_scheme_is_the_recommended_scheme():
    """README 'Which scheme' recommends `directional` and names it the default: the config's default follows the
    records."""
    from hf_relpos import RelPosTransformerConfig

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**Recommendation: `directional`**, the default `position_scheme`" in readme
    assert RelPosTransformerConfig().position_scheme == "directional"


def test_the_convergence_text_holds_in_the_records(report):
    """docs/results.md '20 epochs, last 5 averaged': on the one-commit record directional beyond absolute's spread, rope
    and shaw within it, the peer trained as the recipes and xl (attention dropout 0) behind it beyond it; xl more than
    a BLEU point behind the earlier record's xl (attention dropout 0.1) on validation and beyond the spread on
    test2016, while absolute and
    directional repeat their seeds exactly and shaw moves by less than three hundredths."""
    one_commit = report.read(report.TWENTY_EPOCHS_ONE_COMMIT)["systems"]
    earlier = report.read("convergence/recipes_seeds_1_2/convergence.json")["systems"]
    test = {system: row["averaged_test_bleu"] for system, row in one_commit.items()}
    assert min(test["directional"]) > max(test["absolute"])
    for scheme in ("rope", "shaw"):
        assert min(test[scheme]) <= max(test["absolute"]) and min(test["absolute"]) <= max(test[scheme]), scheme
    for system in ("peer+recipe-training", "xl"):
        assert max(test[system]) < min(test["absolute"]), system
    validation_bleu = {system: row["averaged_validation_bleu"] for system, row in one_commit.items()}
    assert overlaps(validation_bleu["peer+recipe-training"], validation_bleu["absolute"])  # on test2016 only
    # where the peer and absolute differ: absolute's final weights spread across its seeds by more than the peer's
    # gap to it
    gap = statistics.mean(test["absolute"]) - statistics.mean(test["peer+recipe-training"])
    final = one_commit["absolute"]["final_test_bleu"]
    assert max(final) - min(final) > gap > 0
    # Not converged: averaging the last 5 checkpoints adds about a BLEU point over the final weights in every row.
    for system, row in one_commit.items():
        gains = [averaged - final for averaged, final in zip(row["averaged_test_bleu"], row["final_test_bleu"],
                                                             strict=True)]
        assert 0.5 < statistics.mean(gains) < 1.6, system
    validation = "averaged_validation_bleu"
    assert statistics.mean(earlier["xl"][validation]) - statistics.mean(one_commit["xl"][validation]) > 1.0
    assert max(test["xl"]) < min(earlier["xl"]["averaged_test_bleu"])
    for key in (f"{weights}_{split}_bleu" for weights in ("averaged", "final") for split in ("test", "validation")):
        for scheme in ("absolute", "directional"):
            assert earlier[scheme][key] == one_commit[scheme][key], scheme
        assert all(abs(a - b) < 0.03 for a, b in zip(earlier["shaw"][key], one_commit["shaw"][key], strict=True))


def test_the_one_commit_text_holds_in_the_record(report):
    """docs/results.md, the recipes from one commit: both xl rows, rope and directional beyond absolute's seed spread
    and within each other's; shaw and the peer within absolute's, the peer behind both xl rows beyond it; the peer
    pads about half of a batch, the recipes less than a fifth; both xl rows repeat the attention dropout record's runs
    of the same settings to the last digit."""
    rows = report.read(report.ONE_COMMIT)["rows"]
    test = {row: values["test_bleu"] for row, values in rows.items()}
    leaders = ("xl", "xl+attention-dropout-0.1", "rope", "directional")
    for row in leaders:
        assert min(test[row]) > max(test["absolute"]), row
        assert all(overlaps(test[row], test[other]) for other in leaders), row
    peer_with_recipe_tokenizer = report.vs_marian.PEER_WITH_RECIPE_TOKENIZER_ROW
    for row in ("shaw", peer_with_recipe_tokenizer):
        assert overlaps(test[row], test["absolute"]), row
    assert all(max(test[peer_with_recipe_tokenizer]) < min(test[row]) for row in leaders[:2])
    assert min(rows[peer_with_recipe_tokenizer]["padding"]) > 0.45
    assert all(max(rows[row]["padding"]) < 0.2 for row in rows if row != peer_with_recipe_tokenizer)
    dropout = report.read("vs_marian/attention_dropout_xl/vs_marian.json")["rows"]
    for row, same in (("xl", "xl+attention-dropout-0"), ("xl+attention-dropout-0.1", "xl")):
        for split in ("test_bleu", "validation_bleu"):
            assert rows[row][split] == dropout[same][split], (row, split)


def test_the_hybrid_long_bucket_text_holds_in_the_record(report):
    """docs/results.md: on the long bucket every fine-tuned model's output is far shorter than the reference (at most
    0.7 of it), while xl+absolute is ahead of absolute kept on all three seeds: the gain sits under a brevity penalty,
    is not a length effect and is smaller than absolute kept's seed spread."""
    ratios = report.long_bucket_length_ratios()
    assert all(value < 0.7 for values in ratios.values() for value in values)
    record = report.read(report.MARIAN_HYBRID)["schemes"]
    bleu = {scheme: [seed["finetuned_long"]["bleu"] for _, seed in sorted(entry["seeds"].items())]
            for scheme, entry in record.items()}
    assert all(xl > absolute for xl, absolute in zip(bleu["xl+absolute"], bleu["absolute"], strict=True))
    # ... not from longer outputs (shorter than absolute kept's on seeds 1 and 3, longer on seed 2), and by less than
    # the spread of absolute kept's own seeds (README, conversion.md, results.md section 6)
    longer = [xl > absolute for xl, absolute in zip(ratios["xl+absolute"], ratios["absolute"], strict=True)]
    assert longer == [False, True, False]
    gain = statistics.mean(bleu["xl+absolute"]) - statistics.mean(bleu["absolute"])
    assert 0 < gain < max(bleu["absolute"]) - min(bleu["absolute"])
    assert "mostly a brevity effect" not in (ROOT / "README.md").read_text(encoding="utf-8") + (
        ROOT / "docs" / "conversion.md").read_text(encoding="utf-8")
    # ... and not by the length cap: the fixed cap was above every source's source-relative cap and more than twice
    # the longest reference, so only a beam search still running at 89 tokens or more could change under the latter
    bucket = report.read(report.MARIAN_LONG_BUCKET)
    settings = report.read(report.MARIAN_HYBRID)["settings"]
    assert (bucket["pairs"], bucket["max_new_tokens"]) == (settings["long_pairs"], settings["long_max_new_tokens"])
    assert bucket["sources_whose_relative_cap_exceeds_max_new_tokens"] == 0
    assert bucket["max_new_tokens"] > 2 * bucket["reference_tokens"]["max"]
    assert bucket["source_relative_caps"]["min"] == 89


def test_the_hybrid_long_input_text_holds_in_the_record(report):
    """docs/results.md section 6 and docs/conversion.md on the hybrids' long-input record: every fine-tuned conversion
    beats Marian's single-caption BLEU and share kept at 4 captions as one sentence on both sets and every seed, and
    keeps about a third; xl+absolute keeps more than absolute kept seed by seed, by less than absolute's seed spread;
    all far below 70 %; outputs at the cap are few on single captions and the longest tenth, and at 4 as one sentence
    most frequent for the seed that keeps the most and has the longest outputs."""
    import long_inputs

    record = report.read(report.MARIAN_HYBRID_LONG_INPUTS)
    levels = record["levels"]
    converted = ["converted-absolute", "converted-shaw-absolute", "converted-xl-absolute"]
    for set_name in long_inputs.SETS:
        single, joined = f"{set_name}: 1 caption", f"{set_name}: 4 as one sentence"
        kept = {system: long_inputs.bleu_kept(record, joined, system) for system in ["marian", *converted]}
        assert levels[single]["marian"]["seeds"] == [1]
        for system in converted:
            assert levels[single][system]["seeds"] == [1, 2, 3]
            assert min(levels[single][system]["bleu"]) > levels[single]["marian"]["bleu"][0]
            assert min(kept[system]) > kept["marian"][0]
            assert max(kept[system]) < 70
            assert 30 < statistics.mean(kept[system]) < 40   # conversion.md: "loses about two thirds of its BLEU"
            # at the cap: few on single captions and the longest tenth; at 4 as one sentence most for the seed that
            # keeps the most, which also has the longest outputs
            assert max(levels[single][system]["at_cap"]) <= 2
            assert max(levels[f"{set_name}: longest 10 %"][system]["at_cap"]) <= 1
            top = max(range(3), key=lambda index: kept[system][index])
            assert top == max(range(3), key=lambda index: levels[joined][system]["at_cap"][index])
            assert top == max(range(3), key=lambda index: levels[joined][system]["length_ratio"][index])
        xl, absolute = kept["converted-xl-absolute"], kept["converted-absolute"]
        assert all(a < b for a, b in zip(absolute, xl, strict=True))
        assert statistics.mean(xl) - statistics.mean(absolute) < max(absolute) - min(absolute)
        for level in (single, f"{set_name}: longest 10 %"):   # the same single-caption and longest-tenth BLEU
            assert overlaps(levels[level]["converted-xl-absolute"]["bleu"], levels[level]["converted-absolute"]["bleu"])
        shaw = kept["converted-shaw-absolute"]   # tracks absolute kept seed by seed
        assert all(abs(a - b) < 1 for a, b in zip(absolute, shaw, strict=True))


def test_the_length_penalty_text_holds_in_the_records(report):
    """docs/training.md: length penalty 1.0 scored higher than 0.6 on every model of the decoding study, both sets."""
    passage = report.training_length_penalty()
    gains = [float(cell) for line in passage.splitlines()[4:] for cell in line.strip("| ").split(" | ")[2:]]
    assert len(gains) >= 10 and all(gain > 0 for gain in gains)


def test_the_default_position_scheme_is_the_rules_outcome_on_the_records(report):
    """README 'How the default is chosen': report.choose_default on the committed records names the config's default;
    the long-input levels join as columns once recorded."""
    from hf_relpos import RelPosTransformerConfig

    columns = report.default_rule_columns()
    assert {"equal budget, test2016", "equal budget, validation", "20 epochs, test2016",
            "20 epochs, validation"} <= set(columns)
    choice, rows = report.choose_default(columns)
    assert choice == RelPosTransformerConfig().position_scheme
    assert rows["shaw"]["out"] == f"slower than {report.SPEED_FLOOR} x absolute"
    assert rows["none"]["out"] == report.NO_RECIPE
    assert "`none`, the position-blind\ncontrol, has none" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "xl" not in columns["20 epochs, test2016"]  # its 20-epoch runs had another attention dropout


def test_the_scheme_the_readme_names_for_ctranslate2_ties_the_default_and_exports(report):
    """README 'Deploy': the scheme named for a model meant for CTranslate2 has the default's worst rank under the rule
    (on the committed records), is a candidate, and exports, while the default itself does not."""
    from hf_relpos import RelPosTransformerConfig
    from hf_relpos.tools.export import ExportError, check_exportable

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    named = re.search(r"`(\w+)` has the same worst rank as `(\w+)` under the rule that chose the default", readme)
    assert named, "README's Deploy section no longer names a scheme for CTranslate2"
    scheme, default = named.groups()
    choice, rows = report.choose_default(report.default_rule_columns())
    assert default == choice == RelPosTransformerConfig().position_scheme
    assert rows[scheme]["out"] is None and rows[scheme]["worst"] == rows[default]["worst"]
    check_exportable(RelPosTransformerConfig(position_scheme=scheme))
    with pytest.raises(ExportError):
        check_exportable(RelPosTransformerConfig(position_scheme=default))
    assert f"configs/multi30k_small_{scheme}.yaml" in readme.split("## Deploy")[1].split("## Which scheme")[0]


def test_the_rule_ranks_by_seed_spread_and_breaks_ties_by_gpu_speed(report):
    """Rows within each other's spread share a rank; the best worst rank wins; equal worst ranks go to the faster
    (directional trains faster than rope on the H100), whatever the order of the columns."""
    assert report.ranks_by_spread({"a": [1.0, 2.0], "b": [1.5, 3.0], "c": [2.5, 4.0]}) == {"a": 2, "b": 1, "c": 1}
    level = {"absolute": [30.0, 30.2], "directional": [31.0, 31.2], "rope": [31.1, 31.3]}
    assert report.choose_default({"one": level, "two": dict(level)})[0] == "directional"
    behind = {"absolute": [30.0, 30.2], "directional": [29.0, 29.2], "rope": [31.1, 31.3]}
    assert report.choose_default({"one": level, "two": behind})[0] == "rope"
    control_ahead = dict(level, none=[40.0, 40.2])   # the control has no recipe: never the default, however it ranks
    choice, rows = report.choose_default({"one": control_ahead, "two": control_ahead})
    assert choice == "directional" and rows["none"]["worst"] == 1 and rows["none"]["out"] == report.NO_RECIPE
    # a column where some scheme has a single seed has no spread to share ranks by: it does not count
    single_seed = {"absolute": [35.0], "directional": [20.0, 20.2], "rope": [20.1, 20.3]}
    choice, rows = report.choose_default({"one": level, "two": dict(level), "single": single_seed})
    assert choice == "directional" and set(rows["absolute"]["ranks"]) == {"one", "two"}
    assert report.ranked_columns({"one": level, "single": single_seed}) == {"one": level}


def test_the_rules_bounds_are_inclusive_as_the_readme_states_them(report, monkeypatch):
    """'worst seed beats best seed' is strict: a row whose worst seed equals another's best seed does not outrank it,
    and a row of equal seeds does not outrank itself; 'at least 0.8 x absolute's speed': a scheme at exactly
    SPEED_FLOOR is a candidate."""
    assert report.ranks_by_spread({"a": [1.0, 2.0], "b": [2.0, 3.0], "c": [5.0, 5.0]}) == {"a": 2, "b": 2, "c": 1}
    monkeypatch.setattr(report, "gpu_speed", lambda scheme: report.SPEED_FLOOR if scheme == "rope" else 1.0)
    choice, rows = report.choose_default({"one": {"absolute": [30.0, 30.2], "rope": [31.1, 31.3]}})
    assert choice == "rope" and rows["rope"]["out"] is None and rows["rope"]["speed"] == report.SPEED_FLOOR


def test_the_rules_equal_budget_columns_take_each_recipe_as_committed_now(report):
    """`xl`'s equal-budget columns are the one-commit record's row trained as its recipe is now (attention dropout
    0.1), not its `xl` row (attention dropout 0, the recipe then)."""
    columns = report.default_rule_columns()
    for split, name in (("test", "test2016"), ("validation", "validation")):
        one_commit = report.bleu_by_system(report.ONE_COMMIT, split)
        row = report.ONE_COMMIT_RECIPE_ROWS["xl"]
        assert columns[f"equal budget, {name}"]["xl"] == one_commit[row] != one_commit["xl"]


def test_the_rule_leaves_out_runs_of_another_recipe_setting_in_every_record(report, tmp_path, monkeypatch):
    """A long-input record (its runs from several commits) whose `xl` system holds a run trained with attention
    dropout 0, not the committed recipe's 0.1, and a `directional` run with joined pairs: the rule's columns take only
    the runs trained as the recipes are committed now, as in the one-commit records."""
    from hf_relpos.publish.records import RunRecord, Scores, load_recipe

    def run(system: str, seed: int, bleu: float, **changed) -> dict:
        scheme = system.split("+")[0]
        model = {**load_recipe(ROOT / report.RECIPES[scheme])["model"], **changed.pop("model", {})}
        return RunRecord(recipe=f"multi30k_small_{scheme}", system=system, seed=seed, model=model, **changed,
                         scores={"": {"test2016: 1 caption": Scores(bleu, 60.0, "nrefs:1")}}).to_json()

    results = tmp_path / "results"
    results.mkdir()
    for child in report.RESULTS.iterdir():
        if child.name != report.LONG_INPUTS:
            (results / child.name).symlink_to(child)
    record = results / report.LONG_INPUTS / "mixed" / "long_inputs.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"records": [
        run("xl", 1, 30.0), run("xl", 2, 30.2), run("xl", 3, 35.0, model={"attention_dropout": 0.0}),
        run("directional", 1, 31.0), run("directional", 2, 31.2), run("directional", 3, 20.0, concatenated_pairs=0.5),
    ]}), encoding="utf-8")
    monkeypatch.setattr(report, "RESULTS", results)
    assert report.default_rule_columns()["mixed: test2016: 1 caption"] == {"xl": [30.0, 30.2],
                                                                            "directional": [31.0, 31.2]}


def test_a_readme_cell_states_its_mean_spread_and_seed_count(report):
    assert report.seeds_and_spread([30.0]) == "30.00, 1 seed"
    assert report.seeds_and_spread([31.0, 30.0, 32.5]) == "31.17 (30.00-32.50), 3 seeds"


def test_the_rules_recipes_are_the_committed_files_that_train_each_scheme(report):
    """A scheme counts as having a recipe (a candidate of the rule) only where configs/ holds its file, and that file
    trains the scheme: `none`, the control, has none."""
    from hf_relpos.publish.records import load_recipe

    assert "none" in report.SCHEMES and "none" not in report.RECIPES
    assert set(report.RECIPES) == set(report.SCHEMES) - {"none"}
    for scheme, path in report.RECIPES.items():
        assert load_recipe(ROOT / path)["model"]["position_scheme"] == scheme


def test_a_scheme_without_a_recipe_file_has_none_for_the_rule(tmp_path):
    """report.py in a checkout whose configs/ lacks t5's recipe: t5 has no recipe there (the rule sets such a scheme
    out: NO_RECIPE)."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "report.py").write_bytes((ROOT / "experiments" / "report.py").read_bytes())
    (tmp_path / "configs").mkdir()
    for recipe in (ROOT / "configs").glob("multi30k_small_*.yaml"):
        if recipe.name != "multi30k_small_t5.yaml":
            (tmp_path / "configs" / recipe.name).write_bytes(recipe.read_bytes())
    module = load_report(tmp_path / "experiments" / "report.py", "report_without_t5")
    assert "t5" in module.SCHEMES and "t5" not in module.RECIPES and "shaw" in module.RECIPES


def test_the_rule_on_one_set_reads_that_sets_columns_only(report):
    """outcome_on_one_set: the columns named for the set, and no other; a tie on worst rank is named."""
    validation = {"absolute": [30.0, 30.2], "directional": [31.0, 31.2], "rope": [32.0, 32.2]}
    test2016 = {"absolute": [30.0, 30.2], "directional": [33.0, 33.2], "rope": [31.0, 31.2]}
    columns = {"equal budget, validation": validation, "equal budget, test2016": test2016}
    assert report.outcome_on_one_set(columns, "validation") == "**`rope`**"
    assert report.outcome_on_one_set(columns, "test2016") == "**`directional`**"
    assert report.outcome_on_one_set({"equal budget, validation": dict(validation, rope=[31.0, 31.2])},
                                     "validation") == "**`directional`** (tied on worst rank with `rope`, the faster on the GPU)"


def test_the_readme_names_the_columns_the_rule_sets_aside(report, monkeypatch):
    """A column in which some scheme has fewer than MIN_SEEDS seeds is named as set aside under the rule's outcome; a
    long-input record none of whose levels counts is named once, by its number of levels."""
    columns, records = report.default_rule_columns(), report.long_input_records()
    one_seed = {"absolute": [30.0], "directional": [31.0, 31.2]}
    monkeypatch.setattr(report, "long_input_records", lambda: [*records, "probe_record"])
    monkeypatch.setattr(report, "default_rule_columns", lambda: {
        **columns, "a probe, validation": one_seed,
        **{f"probe_record: {level}": one_seed for level in ("test2016: 1 caption", "validation: 1 caption")}})
    set_aside = re.search(r"Set aside, a scheme there having fewer than (\d+) seeds: (.*?)\. Columns",
                          report.readme_default_rule())
    assert set_aside[1] == str(report.MIN_SEEDS)
    assert "a probe, validation" in set_aside[2].split("; ")
    assert f"the 2 levels of `{report.LONG_INPUTS}/probe_record`" in set_aside[2].split("; ")
    assert "probe_record: " not in set_aside[2]


def test_the_readme_says_when_the_sets_alone_disagree(report, monkeypatch):
    """The agreement sentence under the rule's outcome reads both sets' outcomes, not the first only."""
    outcome = report.outcome_on_one_set
    monkeypatch.setattr(report, "outcome_on_one_set", lambda columns, name: (
        "**`absolute`**" if name == "test2016" else outcome(columns, name)))
    assert " Not every set alone gives the outcome of both." in report.readme_default_rule()


def test_a_records_provenance_spans_its_earliest_to_its_latest_run(report, monkeypatch):
    from hf_relpos.publish.records import RunRecord

    runs = [RunRecord(date=date, source_version="abc1234") for date in ("2026-11-20T10:00", "2026-11-18T09:00",
                                                                          "2026-11-22T08:00", "2026-11-19T07:00")]
    monkeypatch.setattr(report, "read_run_records", lambda path: runs)
    line = report.provenance({"date": "2026-11-23T00:00", "device": "CPU", "signature": "nrefs:1"}, "x.json", "cmd")
    assert "(runs 2026-11-18 to 2026-11-22)" in line


def test_the_kernels_column_lists_the_fused_kernel_where_its_rule_covers_the_scheme(report):
    """README's kernels column: relpos_triton for Shaw, the scheme whose clipped terms `triton_clipped_terms` fuses,
    and for no other; transformers' kernels only for schemes that add nothing."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for scheme in report.SCHEMES:
        listed = report.kernels(scheme)
        assert listed in readme
        assert ("relpos_triton" in listed) == (scheme == "shaw"), scheme
        assert ("flash_attention_2/3" in listed) == (scheme in ("absolute", "rope", "none")), scheme


def test_the_recommended_kernel_is_the_fastest_measured_at_each_dropout(report):
    """README's recommended attn_implementation: per scheme and attention dropout of the H200 records, the kernel
    with the highest ratio to absolute named first; relpos_triton rows count only where that kernel runs the scheme
    (elsewhere they are sdpa under its name); sdpa where nothing was measured."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for scheme in report.SCHEMES:
        recommended = report.recommended_kernel(scheme)
        assert recommended in readme
        rows = report.fused_rows(scheme)
        if scheme == "absolute" or not rows:
            assert recommended.startswith("`sdpa`")
            continue
        for part in recommended.split("; "):
            dropout = float(part.rsplit("at dropout ", 1)[1])
            fastest = max((row for row in rows if row["attention_dropout"] == dropout), key=lambda row: row["ratio"])
            assert part.startswith(f"`{fastest['kernel']}`: {fastest['ratio']:.2f}x")
        assert all(row["kernel"] != "relpos_triton" for row in rows) or report.runs_on_triton(scheme)


def test_the_recommended_kernel_names_absolutes_fastest_kernel_as_the_baseline(report, tmp_path, monkeypatch):
    """H200 records in which flex_attention, not sdpa, is absolute's fastest kernel (the records' baseline): README's
    absolute row and caption name that kernel as the baseline, per dropout where the records' baselines differ."""
    def record(dropout: float, baseline: str, sdpa_ratio: float) -> dict:
        rows = [{"scheme": f"absolute@{kernel}", "kernel": kernel, "baseline_kernel": baseline, "length": 512,
                 "ratio": ratio, "memory_overhead": 0.0}
                for kernel, ratio in (("sdpa", sdpa_ratio), ("flex_attention", 1.0 if baseline != "sdpa" else 0.8))]
        return {"meta": {"attention_dropout": dropout, "device_name": "NVIDIA H200", "code": "abc1234"},
                "training": rows}

    results = tmp_path / "results"
    results.mkdir()
    for child in report.RESULTS.iterdir():
        (results / child.name).symlink_to(child)
    fixtures = {"flex_0.1.json": record(0.1, "flex_attention", 0.95), "flex_0.json": record(0.0, "flex_attention", 0.9),
                "sdpa_0.1.json": record(0.1, "sdpa", 1.0)}
    for name, content in fixtures.items():
        (results / name).write_text(json.dumps(content), encoding="utf-8")
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "H200_RECOMMENDED", ("flex_0.1.json", "flex_0.json"))
    assert report.recommended_kernel("absolute") == (
        "`flex_attention` (the baseline; sdpa 0.95x at dropout 0.1, sdpa 0.90x at dropout 0)")
    assert "ratio to `absolute` on flex_attention and peak memory" in report.readme_cost()
    monkeypatch.setattr(report, "H200_RECOMMENDED", ("sdpa_0.1.json", "flex_0.json"))
    assert report.recommended_kernel("absolute") == ("`sdpa` (the baseline at dropout 0.1; flex_attention 0.80x at "
                                                     "dropout 0.1); `flex_attention` (the baseline at dropout 0; sdpa "
                                                     "0.90x at dropout 0)")


def test_the_key_dropout_text_holds_in_the_record(report):
    """README, docs/training.md and docs/benchmarks.md on key dropout, against its 3-seed record:
    level with probability dropout on validation (ranges overlap; the criterion), a little behind on test2016 within
    the spread, three seeds per row."""
    rows = report.read(report.KEY_DROPOUT)["rows"]
    probability, keys = rows[report.PROBABILITY_DROPOUT_ROW], rows[report.KEY_DROPOUT_ROW]
    assert probability["seeds"] == keys["seeds"] == [1, 2, 3]
    for split in ("validation_bleu", "test_bleu"):
        assert overlaps(keys[split], probability[split]), split
    assert statistics.mean(keys["test_bleu"]) < statistics.mean(probability["test_bleu"])
    assert statistics.mean(keys["validation_bleu"]) >= statistics.mean(probability["validation_bleu"])
    assert "level on validation: key dropout is the dropout the fused path runs" in report.benchmarks_key_dropout()


PEER_ROW = "peer+recipe-tokenizer"


def test_the_long_input_text_holds_in_the_record(report):
    """docs/results.md section 5b, claim by claim, against the long-input record: seeds 1-3 of every recipe and of
    the peer; as sentences every model scores lower and writes shorter outputs than on the same captions as one
    sentence; at 4 captions, on both sets, shaw keeps the largest mean share of its single-caption BLEU, both as one
    sentence and as sentences, but as one sentence its worst seed keeps less than the best seeds of directional and
    rope; second: directional as sentences and as one sentence on validation, rope as one sentence on test2016; as
    one sentence t5 keeps the smallest, and the best keeps less than half; as sentences xl keeps the smallest, with
    the shortest outputs. The peer keeps more than absolute (on means, the seeds overlapping) and less than shaw; no
    option is adopted."""
    import long_inputs

    record = report.read("long_inputs/equal_budget/long_inputs.json")
    recipes = ("absolute", "shaw", "directional", "rope", "alibi", "t5", "xl")
    options = dict(long_inputs.option_rows(record))
    levels = {name: {system: row for system, row in level.items() if system in recipes}
              for name, level in record["levels"].items()}
    assert {system: row["seeds"] for system, row in levels["test2016: 1 caption"].items()} == {
        system: [1, 2, 3] for system in recipes}
    for set_name in ("test2016", "validation"):
        for size in (2, 3, 4):
            sentences, one = levels[f"{set_name}: {size} as sentences"], levels[f"{set_name}: {size} as one sentence"]
            for system in sentences:
                for metric in ("bleu", "length_ratio"):
                    assert statistics.mean(sentences[system][metric]) < statistics.mean(one[system][metric]), (
                        set_name, size, system, metric)
        for form in ("one sentence", "sentences"):
            level = f"{set_name}: 4 as {form}"
            seeds_kept = {system: long_inputs.bleu_kept(record, level, system) for system in recipes}
            kept = {system: statistics.mean(values) for system, values in seeds_kept.items()}
            ranked = sorted(kept, key=kept.get, reverse=True)
            second = "rope" if (set_name, form) == ("test2016", "one sentence") else "directional"
            assert ranked[:2] == ["shaw", second], (level, kept)
            assert ranked[-1] == ("t5" if form == "one sentence" else "xl"), (level, kept)
            if form == "one sentence":
                assert max(kept.values()) < 50
                assert all(min(seeds_kept["shaw"]) < max(seeds_kept[other]) for other in ("directional", "rope"))
            else:
                ratios = {system: statistics.mean(row["length_ratio"]) for system, row in levels[level].items()}
                assert min(ratios, key=ratios.get) == "xl", (level, ratios)
    # README 'Which scheme' says the same of the one-sentence form: shaw first on means, then per set the second
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("`shaw` keeps the largest mean share of its single-caption BLEU on test2016 and validation (on means only: "
            "its worst seed keeps less than the best seeds of `directional` and `rope`), second `directional` on "
            "validation and `rope` on test2016, `t5` the smallest") in readme
    # the peer: seeds 1-3; at 4 as one sentence it keeps more than absolute on means (their seeds overlapping; with
    # longer outputs) and less than shaw on both sets, more than directional on test2016 and less on validation
    peer = {name: level[PEER_ROW] for name, level in record["levels"].items()}
    assert peer["test2016: 1 caption"]["seeds"] == [1, 2, 3] and {PEER_ROW, *recipes, *options} == set(
        record["levels"]["test2016: 1 caption"])
    for set_name in ("test2016", "validation"):
        level = f"{set_name}: 4 as one sentence"
        peer_seeds_kept = long_inputs.bleu_kept(record, level, PEER_ROW)
        seeds_kept = {scheme: long_inputs.bleu_kept(record, level, scheme) for scheme in recipes}
        peer_kept = statistics.mean(peer_seeds_kept)
        scheme_kept = {scheme: statistics.mean(values) for scheme, values in seeds_kept.items()}
        assert scheme_kept["absolute"] < peer_kept < scheme_kept["shaw"], (level, peer_kept, scheme_kept)
        assert min(peer_seeds_kept) < max(seeds_kept["absolute"])
        assert (peer_kept > scheme_kept["directional"]) == (set_name == "test2016"), (level, peer_kept, scheme_kept)
        assert statistics.mean(peer[level]["length_ratio"]) > statistics.mean(levels[level]["absolute"]["length_ratio"])
    # the options: length scaling on shaw and directional, a window of 8 on shaw, joined captions on both (three seeds
    # each) and randomized positions on absolute (one), none adopted; randomized positions lose most of absolute's
    # single-caption BLEU with outputs over 1.5 x the references' length
    concatenation = {"shaw+concat-0.5": "shaw", "shaw+concat-0.2": "shaw", "directional+concat-0.5": "directional"}
    assert options == {"shaw+length-scaling": "shaw", "directional+length-scaling": "directional",
                       "absolute+randomized-positions": "absolute", "shaw+window-8": "shaw", **concatenation}
    # joined captions (concatenated_pairs): at 4 as one sentence each keeps more than any recipe and the peer on both
    # sets (on validation beyond its recipe's spread with 0.5, within it with 0.2); at 4 as sentences about twice its
    # recipe's share; single captions cost more than the criterion allows on both sets; directional loses most; the
    # best keeps less than the goal
    for option, recipe in concatenation.items():
        verdict, figures = long_inputs.option_verdict(record, option, recipe)
        lead = figures["validation kept"] - figures["validation recipe kept"]
        assert (lead > figures["validation recipe spread"]) == option.endswith("0.5") and lead > 0, (option, figures)
        for set_name in ("test2016", "validation"):
            one, sentences = f"{set_name}: 4 as one sentence", f"{set_name}: 4 as sentences"
            others = [*recipes, PEER_ROW]
            assert statistics.mean(long_inputs.bleu_kept(record, one, option)) > max(
                statistics.mean(long_inputs.bleu_kept(record, one, other)) for other in others), (option, set_name)
            assert statistics.mean(long_inputs.bleu_kept(record, one, option)) < 70
            share = statistics.mean(long_inputs.bleu_kept(record, sentences, option))
            assert 1.6 < share / statistics.mean(long_inputs.bleu_kept(record, sentences, recipe)) < 2.5, option
        assert figures["test2016 1 caption difference"] < -long_inputs.OPTION_COST
        assert figures["validation 1 caption difference"] < -long_inputs.OPTION_COST
        assert verdict.startswith("not adopted")
    costs = {option: long_inputs.option_verdict(record, option, recipe)[1]["test2016 1 caption difference"]
             for option, recipe in concatenation.items()}
    assert min(costs, key=costs.get) == "directional+concat-0.5"
    for option, recipe in options.items():
        verdict, figures = long_inputs.option_verdict(record, option, recipe)
        if option == "absolute+randomized-positions":   # one seed decides nothing; it failed the cost part
            assert verdict.startswith("not decided") and "failed so far: test2016 single captions" in verdict
        else:
            assert verdict.startswith("not adopted"), (option, verdict)
            assert record["levels"]["test2016: 1 caption"][option]["seeds"] == [1, 2, 3], option
        if option.endswith(("length-scaling", "window-8")):   # validation kept within the recipe's seed spread
            lead = figures["validation kept"] - figures["validation recipe kept"]
            assert abs(lead) < figures["validation recipe spread"], (option, figures)
        if option.endswith("window-8"):   # keeps less than shaw on both sets, at about its single-caption BLEU
            assert all(figures[f"{set_name} kept"] < figures[f"{set_name} recipe kept"]
                       for set_name in ("test2016", "validation")), figures
            assert all(abs(figures[f"{set_name} 1 caption difference"]) <= long_inputs.OPTION_COST
                       for set_name in ("test2016", "validation")), figures
    scattered = {name: level["absolute+randomized-positions"] for name, level in record["levels"].items()}
    for set_name in ("test2016", "validation"):
        single = f"{set_name}: 1 caption"
        assert scattered[single]["bleu"][0] < statistics.mean(levels[single]["absolute"]["bleu"]) / 2
        assert scattered[single]["length_ratio"][0] > 1.5


def test_the_long_input_decoding_reading_holds_in_its_records(report):
    """docs/results.md 5b and README, the decoding study's reading: the verdicts; directional's test2016 figures;
    its seeds failing in opposite ways; its share the same (within a point, both sets) at length penalty 1.0 as at
    0.6; shaw+concat-0.5 keeping more at 1.0 than at 0.6 and most with the 0.7 minimum, chrF rising with it, below
    the long-input goal's 70 % on both sets, where it costs single captions most of the length penalty 1.0 settings."""
    import long_inputs

    records = {path.parent.name: json.loads(path.read_text(encoding="utf-8"))
               for path in (report.RESULTS / report.LONG_INPUT_DECODING).glob("*/long_inputs.json")}
    assert set(records) == {"lp0.6", "lp1.0", "lp1.0-min0.5", "lp1.0-min0.7", "lp1.0-norepeat4", "lp1.0-norepeat6"}
    for name in ("lp1.0-norepeat4", "lp1.0-norepeat6"):   # blocked n-grams: not adopted, loops ended, BLEU unmoved
        verdict, figures = long_inputs.decoding_verdict(records["lp1.0"], records[name])
        assert verdict.startswith("not adoptable: directional seed 2: 4 as one sentence -")
        assert abs(figures["joined gain"]) < 0.1 and abs(figures["single gain"]) < 0.1
        for set_name in long_inputs.SETS:
            level = f"{set_name}: {long_inputs.OPTION_LEVEL}"
            blocked, plain = records[name]["levels"][level]["directional"], records["lp1.0"]["levels"][level]["directional"]
            assert blocked["at_cap"][0] <= plain["at_cap"][0] / 3
            assert statistics.mean(blocked["length_ratio"]) < statistics.mean(plain["length_ratio"])
    assert "Blocking repeated n-grams is not adopted" in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    minimums = {name: record for name, record in records.items() if "norepeat" not in name}
    for name, cost in (("lp1.0-min0.5", "-0.38"), ("lp1.0-min0.7", "-0.99")):
        verdict, figures = long_inputs.decoding_verdict(records["lp1.0"], records[name])
        assert verdict == f"not adoptable: shaw+concat-0.5 seed 1: 1 caption {cost} BLEU"
        assert figures["smallest joined gain"] > 0
        single = records[name]["levels"]["validation: 1 caption"]["directional"]["bleu"]
        assert all(bleu > base for bleu, base in zip(
            single, records["lp1.0"]["levels"]["validation: 1 caption"]["directional"]["bleu"], strict=True))
        test_joined = records[name]["levels"]["test2016: 4 as one sentence"]["directional"]
        baseline_joined = records["lp1.0"]["levels"]["test2016: 4 as one sentence"]["directional"]
        assert test_joined["seeds"][0] == 1 and test_joined["bleu"][0] < baseline_joined["bleu"][0]
    assert "No minimum length is adopted" in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    test_single = {name: statistics.mean(records[name]["levels"]["test2016: 1 caption"]["directional"]["bleu"])
                   for name in ("lp1.0", "lp1.0-min0.7")}
    assert test_single["lp1.0-min0.7"] < test_single["lp1.0"]
    records = minimums
    for set_name in long_inputs.SETS:
        level = f"{set_name}: {long_inputs.OPTION_LEVEL}"
        for record in records.values():   # directional seed 1 runs on to the cap, seed 2 is short on average
            row = record["levels"][level]["directional"]
            assert row["seeds"] == [1, 2] and row["at_cap"][0] > record["sizes"][level] / 10 > row["at_cap"][1]
            assert row["length_ratio"][1] < 1

        def kept(name: str, system: str, level: str = level) -> float:
            return statistics.mean(long_inputs.bleu_kept(records[name], level, system))

        assert abs(kept("lp1.0", "directional") - kept("lp0.6", "directional")) < 1
        shares = {name: kept(name, "shaw+concat-0.5") for name in records}
        assert shares["lp1.0"] > shares["lp0.6"] and max(shares, key=shares.get) == "lp1.0-min0.7"
        assert shares["lp1.0-min0.7"] < 70
        assert max(kept(name, "directional") for name in records) < shares["lp1.0-min0.7"]
        chrf = {name: statistics.mean(records[name]["levels"][level]["shaw+concat-0.5"]["chrf"]) for name in records}
        assert chrf["lp1.0-min0.7"] > chrf["lp1.0"]
        single = {name: statistics.mean(records[name]["levels"][f"{set_name}: 1 caption"]["shaw+concat-0.5"]["bleu"])
                  for name in records if name.startswith("lp1.0")}
        assert min(single, key=single.get) == "lp1.0-min0.7"


def test_the_up_to_4_probe_text_holds_in_its_records(report):
    """docs/results.md 5b, the equal-budget probe of joins of up to 4 captions (seeds 1 and 2): at 4 captions as one
    sentence it keeps about two thirds of its single-caption BLEU on both sets, shaw less than two fifths,
    shaw+concat-0.5 about half, and it scores more BLEU there than either; no seed reaches the long-input goal's 70 %; on single
    captions four and a half to five BLEU below shaw on both sets."""
    import long_inputs

    probe = report.read("vs_marian/concat_up_to_4/long_inputs/long_inputs.json")
    equal_budget = report.read(f"{report.LONG_INPUTS}/equal_budget/long_inputs.json")
    option = "shaw+concat-0.5-up-to-4"
    training = report.read("vs_marian/concat_up_to_4/vs_marian.json")
    assert {name: row["seeds"] for name, row in training["rows"].items()} == {option: [1, 2]}
    for set_name in long_inputs.SETS:
        level = f"{set_name}: {long_inputs.OPTION_LEVEL}"
        assert probe["levels"][level][option]["seeds"] == [1, 2]
        kept = long_inputs.bleu_kept(probe, level, option)
        assert 100 * 0.6 < statistics.mean(kept) < 100 * 0.7 and max(kept) < report.LONG_INPUT_KEPT_GOAL
        assert statistics.mean(long_inputs.bleu_kept(equal_budget, level, "shaw")) < 100 * 2 / 5
        assert 45 < statistics.mean(long_inputs.bleu_kept(equal_budget, level, "shaw+concat-0.5")) < 55
        joined_bleu = statistics.mean(probe["levels"][level][option]["bleu"])
        assert all(joined_bleu > statistics.mean(equal_budget["levels"][level][system]["bleu"])
                   for system in ("shaw", "shaw+concat-0.5"))
        single = f"{set_name}: 1 caption"
        cost = (statistics.mean(equal_budget["levels"][single]["shaw"]["bleu"])
                - statistics.mean(probe["levels"][single][option]["bleu"]))
        assert 4.45 <= cost <= 5.2 and cost > long_inputs.OPTION_COST


def test_the_joined_pair_20_epoch_text_holds_in_its_records(report):
    """docs/results.md 5b, the 20-epoch joined-pair pilot: one seed of each, so nothing decided; at 4 captions as one
    sentence shaw+concat-0.5 keeps about two thirds of its single-caption BLEU on both sets, shaw less than half, with
    outputs nearer the references' length and significant paired tests, more than the equal-budget option kept at
    length penalty 1.0, short of the long-input goal; on single captions above shaw on test2016, below it by more than
    the criterion allows on validation, neither paired test significant, while at the equal budget below on both."""
    import long_inputs

    record = report.read(f"{report.JOINED_PAIRS_20_EPOCHS}/long_inputs.json")
    levels = record["levels"]
    assert {system: row["seeds"] for system, row in levels["test2016: 1 caption"].items()} == {
        "shaw": [1], "shaw+concat-0.5": [1]}
    option = "shaw+concat-0.5"
    verdict, figures = long_inputs.option_verdict(record, option, "shaw")
    assert verdict.startswith("not decided") and "goal not decided" in report.joined_pairs_goal(record)
    equal_budget_lp1 = report.read(f"{report.LONG_INPUT_DECODING}/lp1.0/long_inputs.json")
    assert equal_budget_lp1["levels"][f"test2016: {long_inputs.OPTION_LEVEL}"][option]["seeds"] == [1, 2]
    _, equal_budget = long_inputs.option_verdict(report.read(f"{report.LONG_INPUTS}/equal_budget/long_inputs.json"),
                                                 option, "shaw")
    assert max(equal_budget["test2016 1 caption difference"],
               equal_budget["validation 1 caption difference"]) < -long_inputs.OPTION_COST
    tests = record["paired_tests"]["systems"]["shaw+concat-0.5"]
    for set_name in long_inputs.SETS:
        level = f"{set_name}: {long_inputs.OPTION_LEVEL}"
        assert 60 < figures[f"{set_name} kept"] < report.LONG_INPUT_KEPT_GOAL and figures[f"{set_name} recipe kept"] < 50
        assert (abs(1 - levels[level]["shaw+concat-0.5"]["length_ratio"][0])
                < abs(1 - levels[level]["shaw"]["length_ratio"][0]))
        assert figures[f"{set_name} kept"] > statistics.mean(long_inputs.bleu_kept(equal_budget_lp1, level, option))
        assert tests[level]["1"]["difference"] > 0 and tests[level]["1"]["p_value"] < 0.05
        assert tests[f"{set_name}: 1 caption"]["1"]["p_value"] > 0.05
    assert figures["test2016 1 caption difference"] > 0
    assert figures["validation 1 caption difference"] < -long_inputs.OPTION_COST
    training = report.read(f"{report.JOINED_PAIRS_20_EPOCHS}/convergence.json")
    assert {system: row["seeds"] for system, row in training["systems"].items()} == {"shaw": [1], "shaw+concat-0.5": [1]}
    assert (training["systems"]["shaw+concat-0.5"]["averaged_test_bleu"]
            == levels["test2016: 1 caption"]["shaw+concat-0.5"]["bleu"]), "the two records decode alike"


def scored_entries(value, path=""):
    """(path, scores) of every sacreBLEU scoring in a record: a dict holding bleu and length_ratio."""
    if isinstance(value, dict):
        if "bleu" in value and "length_ratio" in value:
            yield path, value
        for key, item in value.items():
            yield from scored_entries(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from scored_entries(item, f"{path}[{index}]")


def test_recorded_scores_agree_with_themselves():
    """Without the hypotheses (not committed) BLEU cannot be recomputed, but a record's figures must agree: each
    brevity penalty is sacreBLEU's of its length ratio (exp(1 - 1/ratio) below 1), every BLEU signature of a
    record is the one its table states, and a table's per-seed lists are its runs' scores."""
    checked = 0
    for path in sorted((ROOT / "docs" / "results").rglob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        signatures = set()
        for where, scores in scored_entries(record):
            if "brevity_penalty" in scores:
                ratio = scores["length_ratio"]
                expected = 1.0 if ratio >= 1 else math.exp(1 - 1 / ratio)
                assert scores["brevity_penalty"] == pytest.approx(expected, abs=1e-9), (path, where)
                assert scores["bleu"] <= 100 * scores["brevity_penalty"] + 1e-9, (path, where)
                checked += 1
            signatures.add(scores.get("bleu_signature") or scores.get("signature"))
        signatures.discard(None)
        stated = record.get("signature") if isinstance(record.get("signature"), str) else (
            record.get("signatures", {}).get("bleu") if isinstance(record.get("signatures"), dict) else None)
        if stated is not None and signatures:
            assert signatures == {stated}, path
        if path.name == "vs_marian.json":
            for name, row in record["rows"].items():
                for key in ("validation_bleu", "test_bleu", "validation_length_ratio", "test_length_ratio"):
                    split, metric = key.split("_", 1)
                    assert row[key] == [run["scores"][split][metric] for run in record["runs"][name]], (path, name)
        if path.name == "long_inputs.json":
            for level, systems in record["levels"].items():
                for system, row in systems.items():
                    for metric in ("bleu", "chrf", "length_ratio"):
                        assert row[metric] == [run["scores"][level][metric] for run in record["runs"][system]], (
                            path, level, system)
    assert checked > 1000


def page_text(page: str) -> str:
    """A page's text with its line breaks and runs of spaces as single spaces (a sentence may wrap anywhere)."""
    return " ".join((ROOT / page).read_text(encoding="utf-8").split())


def test_the_flex_attention_speed_reading_holds_in_its_records(report):
    """docs/benchmarks.md: without dropout, flex_attention was slower than sdpa for every scheme timed but shaw (the
    two H200 records at 3c5d2ac, n = 512)."""
    flex_faster = set()
    for path in report.H200_FUSED[1:]:
        rows = {(row["scheme"].partition("@")[0], row["kernel"]): row["ratio"] for row in report.read(path)["training"]}
        for scheme in {scheme for scheme, _ in rows}:
            if rows[scheme, "flex_attention"] > rows[scheme, "sdpa"]:
                flex_faster.add(scheme)
    assert flex_faster == {"shaw"}
    assert "without dropout it was slower than sdpa for every scheme timed but `shaw`" in page_text("docs/benchmarks.md")


def test_the_fused_launch_reduction_reading_holds_in_its_record(report):
    """docs/benchmarks.md, since d34293a: after 86fb072 every alternated run's extra host time for shaw is below every
    run's before it, with 12 Triton launches a step fewer (one per self-attention layer) and, under bfloat16 autocast,
    fewer aten operators."""
    def shaw(name):
        rows = report.read(f"{report.HOST_OVERHEAD_TRITON_86FB072}/{name}/host_overhead.json")["rows"]
        return next(row for row in rows if row["series"] == "shaw@relpos_triton")

    runs = report.HOST_OVERHEAD_TRITON_RUNS
    before = [shaw(name)["extra_ms"] for name in runs if name.startswith("before")]
    after = [shaw(name)["extra_ms"] for name in runs if name.startswith("after")]
    assert len(before) == len(after) == 3 and max(after) < min(before)
    assert {shaw(name)["triton_launches"] for name in runs} == {48, 36}
    assert shaw("before1")["triton_launches"] - shaw("after1")["triton_launches"] == 12
    assert shaw("after_bf16")["operators"] < shaw("before_bf16")["operators"]
    assert ("In every alternated run `shaw`'s extra host time at `86fb072` is below every run's at `6606b91`"
            in page_text("docs/benchmarks.md"))


def test_the_cpu_speed_reading_holds_in_its_record(report):
    """docs/benchmarks.md, CPU: the whole model (1 + 1 layers, n up to 256) costs little beyond absolute with any
    relative scheme (within 15 %), while one attention layer of shaw, shaw-k or xl costs markedly more as n grows (its
    ratio falls from the shortest to the longest length, below 0.65 there)."""
    rows = report.read("benchmarks/issue16/training_after.json")["training"]
    model = [row for row in rows if row["benchmark"] == "model"]
    assert max(row["length"] for row in model) == 256 and min(row["ratio"] for row in model) > 0.85
    for scheme in ("shaw", "shaw-k", "xl"):
        attention = [row for row in rows if row["benchmark"] == "attention" and row["scheme"] == scheme]
        shortest = min(attention, key=lambda row: row["length"])
        longest = [row for row in attention if row["length"] == max(row["length"] for row in attention)]
        assert all(row["ratio"] < min(0.65, shortest["ratio"]) for row in longest), scheme
    assert ("On a CPU the whole model (1 + 1 layers, n up to 256) costs little beyond `absolute` with any relative "
            "scheme, while one attention layer of `shaw`, `shaw-k` or `xl` costs markedly more as n grows"
            in page_text("docs/benchmarks.md"))


def test_the_fresh_set_reading_holds_in_its_records(report):
    """docs/results.md: on sets never looked at (evaluation seed 2026) against those that chose the settings (1234),
    the six saved models score lower at lengths 1-40 on the mean, two of them higher at 21-40, and every one higher
    at 41-80."""
    accuracies = {}
    for folder in sorted((report.RESULTS / report.SAVED_MODELS).glob("seed*")):
        for seed in (1234, 2026):
            record = report.read(f"{report.SAVED_MODELS}/{folder.name}/eval_seed_{seed}/saved_models.json")
            (run,) = report.read_run_records(report.RESULTS / report.SAVED_MODELS / folder.name / f"eval_seed_{seed}"
                                             / "saved_models.json")
            accuracies[folder.name, seed] = [run.metrics[bucket]["accuracy"] for bucket in record["buckets"]]
    models = sorted({name for name, _ in accuracies})
    assert len(models) == 6 and record["buckets"] == ["1-20", "21-40", "41-80"]
    differences = [[fresh - chose for fresh, chose in zip(accuracies[name, 2026], accuracies[name, 1234], strict=True)]
                   for name in models]
    means = [statistics.mean(column) for column in zip(*differences, strict=True)]
    assert means[0] < 0 and means[1] < 0
    assert sum(row[1] > 0 for row in differences) == 2 and all(row[2] > 0 for row in differences)
    assert ("a little lower at lengths 1-40 on average (at 21-40 two of the six score higher), higher at 41-80 (every "
            "one)" in page_text("docs/results.md"))


def test_the_hybrid_validation_curve_reading_holds_in_the_record(report):
    """docs/results.md: at the last step of the validation curve both hybrids end level with absolute kept, each
    ahead of it on two seeds and behind on the third, their mean within the range of absolute kept's seeds."""
    schemes = report.read(report.MARIAN_HYBRID)["schemes"]
    final = {scheme: [seed["curve"][-1]["bleu"] for _, seed in sorted(entry["seeds"].items())]
             for scheme, entry in schemes.items()}
    kept = final["absolute"]
    for hybrid in ("shaw+absolute", "xl+absolute"):
        assert sum(value > reference for value, reference in zip(final[hybrid], kept, strict=True)) == 2, hybrid
        assert min(kept) <= statistics.mean(final[hybrid]) <= max(kept), hybrid
    assert ("where both end level with it (each a little ahead of it on two seeds and behind on the third, within the "
            "spread of its seeds)" in page_text("docs/results.md"))


def test_the_hybrid_test2016_reading_holds_in_the_record(report):
    """docs/results.md: on test2016 each hybrid's seed-by-seed difference from absolute kept is within a third of the
    spread between absolute kept's seeds (0.17 against 0.53 BLEU)."""
    schemes = report.read(report.MARIAN_HYBRID)["schemes"]
    test = {scheme: [seed["finetuned"]["bleu"] for _, seed in sorted(entry["seeds"].items())]
            for scheme, entry in schemes.items()}
    kept = test["absolute"]
    largest = max(abs(value - reference) for hybrid in ("shaw+absolute", "xl+absolute")
                  for value, reference in zip(test[hybrid], kept, strict=True))
    spread = max(kept) - min(kept)
    assert largest <= spread / 3
    assert ("seed-by-seed differences within a third of the spread between `absolute` kept's seeds"
            in page_text("docs/results.md"))


def test_the_short_length_fused_kernel_reading_holds_in_its_records(report):
    """docs/benchmarks.md: at n = 128 relpos_triton is not faster than sdpa for shaw beyond what one run tells: a
    little slower at 1f3e7bf, 8ed37f1 and a0f821f, a little faster at cae802d, where absolute's two identically computed
    series (sdpa, and relpos_triton passing a scheme without terms to sdpa) differed most at this length, and at
    e8f9f2f, where they differed less at this length than at n = 1024; faster by more than a tenth at d34293a, where
    they differed by about two hundredths at most."""
    def ratios(path: str) -> dict[tuple[str, int], float]:
        return {(row["scheme"], row["length"]): row["ratio"] for row in report.read(path)["training"]}

    def noise(path: str) -> dict[int, float]:
        return {length: abs(1 - ratio) for (scheme, length), ratio in ratios(path).items()
                if scheme == "absolute@relpos_triton"}

    for path, faster in ((report.H200_LENGTHS, False), (report.H200_8ED37F1_LENGTHS, False),
                         (report.H200_A0F821F_LENGTHS, False), (report.H200_E8F9F2F_LENGTHS, True),
                         (report.H200_LENGTHS_CAE802D, True)):
        found = ratios(path)
        assert (found["shaw@relpos_triton", 128] > found["shaw@sdpa", 128]) is faster, path
        assert abs(found["shaw@relpos_triton", 128] - found["shaw@sdpa", 128]) < 0.1, path
    found = noise(report.H200_LENGTHS_CAE802D)
    assert max(found, key=found.get) == 128
    found = noise(report.H200_E8F9F2F_LENGTHS)
    assert found[128] < found[1024]
    latest = ratios(report.H200_LATEST_LENGTHS)
    assert latest["shaw@relpos_triton", 128] - latest["shaw@sdpa", 128] > 0.1
    assert max(noise(report.H200_LATEST_LENGTHS).values()) < 0.025
    text = page_text("docs/benchmarks.md")
    assert ("the fused kernel was not faster than sdpa beyond what one run tells up to `e8f9f2f`: a little slower at "
            "`1f3e7bf`, `8ed37f1` and `a0f821f`, a little faster at `cae802d` (where absolute's two "
            "identically computed series differed most at this length;" in text)
    assert ("and at `e8f9f2f` (where `absolute`'s two series differed less at this length than at n = 1024); at "
            "`d34293a` it was faster by more than a tenth, where `absolute`'s two series differed by about two "
            "hundredths at most." in text)


def test_the_prepared_check_lists_hold_in_the_later_checks_records(report):
    """docs/benchmarks.md, the prepared check: relpos_triton's first call at n = 512, step (a)'s time in all (its
    check_log line) and a host-bound step (t) (the host returns from shaw's step within a millisecond of the device)
    in each of the later checks it lists."""
    checks = {"1f3e7bf": report.H200_LENGTHS_CHECK, "8ed37f1": report.H200_8ED37F1_CHECK,
              "a0f821f": report.H200_A0F821F_CHECK, "e8f9f2f": report.H200_E8F9F2F_CHECK,
              "d34293a": report.H200_LATEST_CHECK}
    first_calls, step_a = [], []
    for code, check in checks.items():
        rows = report.read(f"{check}/{report.H200_LENGTHS_RECORD}")["training"]
        first_calls.append(next(f"{row['first_call_s']:.1f} s" for row in rows
                                if (row["scheme"], row["length"]) == ("shaw@relpos_triton", 512)))
        log = (ROOT / "docs" / "results" / check / "check_log.txt").read_text(encoding="utf-8")
        seconds = re.search(r"^== [(]a[)] .*: exit 0 after (\d+) s", log, re.MULTILINE)[1]
        step_a.append(f"{seconds} s at `{code}`")
    for code in ("a0f821f", "e8f9f2f", "d34293a"):
        shaw = report.read(f"{checks[code]}/timeline_n512/timeline.json")["results"]["shaw@relpos_triton"]["timing"]
        assert shaw["drained_ms"] - shaw["enqueue_ms"] < 1, code
    text = page_text("docs/benchmarks.md")
    assert (f"({', '.join(first_calls[:-1])} and {first_calls[-1]} in the five later checks, at `1f3e7bf`, `8ed37f1`, "
            "`a0f821f`, `e8f9f2f` and `d34293a`;" in text)
    assert f"(171 s in all at `cae802d`, {', '.join(step_a)});" in text
    assert "the step was host-bound at `8ed37f1`, `a0f821f`, `e8f9f2f` and `d34293a`);" in text


def test_the_d34293a_lengths_reading_holds_against_e8f9f2f(report):
    """docs/benchmarks.md, the d34293a section: shaw on relpos_triton ran faster against absolute than at e8f9f2f at
    every length: at n = 128 and 512 by more than either run's noise (absolute on relpos_triton, which hands the call
    to sdpa, against absolute on sdpa), at n = 1024 by less than e8f9f2f's."""
    def ratios(path: str, scheme: str) -> dict[int, float]:
        return {row["length"]: row["ratio"] for row in report.read(path)["training"] if row["scheme"] == scheme}

    gain = {n: ratio - ratios(report.H200_E8F9F2F_LENGTHS, "shaw@relpos_triton")[n]
            for n, ratio in ratios(report.H200_LATEST_LENGTHS, "shaw@relpos_triton").items()}
    noise, latest_noise = ({n: abs(1 - ratio) for n, ratio in ratios(path, "absolute@relpos_triton").items()}
                           for path in (report.H200_E8F9F2F_LENGTHS, report.H200_LATEST_LENGTHS))
    assert sorted(gain) == [128, 512, 1024] and all(value > 0 for value in gain.values())
    assert all(gain[n] > max(noise[n], latest_noise[n]) for n in (128, 512)) and gain[1024] < noise[1024]
    assert ("`shaw` on `relpos_triton` ran faster against `absolute` than at `e8f9f2f` at every length: at n = 128 and "
            "512 by more than either run's noise, at n = 1024 by less than `e8f9f2f`'s (one run each)."
            in page_text("docs/benchmarks.md"))


def test_the_runtime_copies_reading_holds_in_the_e8f9f2f_record(report):
    """docs/benchmarks.md, the e8f9f2f section: shaw's profiled n = 512 step made 74 cudaMemcpyAsync at a0f821f and
    2 at e8f9f2f (masked_fill's clone, which absolute's step makes too, and torch.equal's item), with one
    cudaStreamSynchronize (the item's); its host enqueue time did not fall."""
    def shaw_and_absolute(path: str) -> tuple[dict, dict]:
        results = report.read(path)["results"]
        return results["shaw@relpos_triton"], results["absolute@sdpa"]

    (before, _), (after, absolute) = (shaw_and_absolute(path)
                                      for path in (report.H200_A0F821F_TIMELINE, report.H200_E8F9F2F_TIMELINE))
    assert before["profile"]["blocking"]["cudaMemcpyAsync"]["count"] == 74
    copies, syncs = (after["profile"]["blocking"][call] for call in ("cudaMemcpyAsync", "cudaStreamSynchronize"))
    assert copies["issued_by"] == {"aten::copy_ < aten::clone < aten::masked_fill": 1,
                                   "aten::_local_scalar_dense < aten::item < aten::equal": 1}
    assert syncs["issued_by"] == {"aten::_local_scalar_dense < aten::item < aten::equal": 1}
    assert absolute["profile"]["blocking"]["cudaMemcpyAsync"]["issued_by"] == {
        "aten::copy_ < aten::clone < aten::masked_fill": 1}
    assert after["timing"]["enqueue_ms"] > before["timing"]["enqueue_ms"]
    assert (before["profile"]["kernels"], after["profile"]["kernels"]) == (2063, 1907)


def test_the_prepare_stage_training_reading_holds_in_its_records(report):
    """docs/benchmarks.md, the per-forward position stage: one layer's ratios stay within a few hundredths (shaw and
    xl a little lower after), while every scheme's whole-model ratio is higher after."""
    before, after = ({(row["benchmark"], row["scheme"]): row["ratio"] for row in report.read(stem)["training"]}
                     for stem in ("benchmarks/prepare_stage/training_before.json",
                                  "benchmarks/prepare_stage/training_after.json"))
    assert before.keys() == after.keys()
    layer = {scheme: after[kind, scheme] - before[kind, scheme] for kind, scheme in before if kind == "attention"}
    assert all(abs(change) < 0.04 for change in layer.values()), layer
    assert layer["shaw"] < -0.01 and layer["xl"] < -0.01
    assert all(abs(change) < 0.01 for scheme, change in layer.items() if scheme not in ("shaw", "xl")), layer
    assert all(after[kind, scheme] > before[kind, scheme]
               for kind, scheme in before if kind == "model" and scheme != "absolute")
    assert ("the relative schemes' cost there stays where it was (within a few hundredths of the ratio, `shaw` and "
            "`xl` a little lower), far from what the GPU speed goals (below) ask of them on a CPU. The whole model gains "
            "where per-layer work was removed: every scheme's ratio is higher after." in page_text("docs/benchmarks.md"))


def test_the_relpos_triton_lengths_passage_meets_the_speed_goal_from_0_85x(report, monkeypatch):
    """relpos_triton's speed goal (at least 0.85 x absolute's tokens/s) on a hand-made record: met at exactly 0.85, not
    at 0.84; the extra ms per step are against the faster of absolute's two series."""
    def row(length, scheme, ratio, seconds):
        return {"length": length, "scheme": scheme, "ratio": ratio, "memory_overhead": 0.05, "seconds": seconds}

    record = {"meta": {"code": "abc", "attention_dropout": 0.1, "repeats": 2},
              "training": [row(n, scheme, ratio, seconds) for n, ratios in ((128, 0.84), (512, 0.85))
                           for scheme, ratio, seconds in (("absolute@sdpa", 1.0, [0.010, 0.010]),
                                                          ("absolute@relpos_triton", 0.9, [0.011, 0.011]),
                                                          ("shaw@relpos_triton", ratios, [0.012, 0.013]),
                                                          ("shaw@sdpa", 0.5, [0.020, 0.020]))]}
    monkeypatch.setattr(report, "read", lambda path: record)
    text = report.relpos_triton_lengths("check", "note")
    assert "speed goal (0.85 x absolute) met at n = 512. " in text
    assert "takes 2.5, 2.5 ms more than `absolute` (10.0, 10.0 ms" in text


def test_the_h200_summary_meets_relpos_tritons_goals_at_their_bounds(report, monkeypatch):
    """relpos_triton's goals on a hand-made record: 0.85 x absolute's speed and a tenth more peak memory are met."""
    rows = [{"scheme": scheme, "length": 512, "batch": 32, "ratio": ratio, "memory_overhead": memory}
            for scheme, ratio, memory in (("shaw@relpos_triton", 0.85, 0.10), ("shaw@sdpa", 0.5, 0.3),
                                          ("absolute@flex_attention", 0.9, 0.0), ("shaw@flex_attention", 0.7, 0.2))]
    record = {"meta": {"device_name": "GPU", "dtype": "bfloat16", "warmup": 3, "repeats": 10, "code": "abc",
                       "attention_dropout": 0.1}, "training": rows}
    monkeypatch.setattr(report, "read", lambda path: record)
    monkeypatch.setattr(report, "relpos_triton_lengths", lambda check, note: "")
    monkeypatch.setattr(report, "h200_step_timeline", lambda timeline, kernel_times: "")
    monkeypatch.setattr(report, "h200_host_work", lambda timeline: "")
    goals = "`relpos_triton`'s goals at this length (at least 0.85 x absolute's tokens/s, at most 10% more peak memory)"
    assert f"{goals}: speed met, memory met." in report.benchmarks_h200_summary()
    record["training"][0] |= {"ratio": 0.84, "memory_overhead": 0.11}
    assert f"{goals}: speed not met, memory not met." in report.benchmarks_h200_summary()


def test_the_three_seed_reading_holds_in_the_records(report):
    """docs/results.md 5, three seeds: directional beyond absolute's spread on both sets, rope and shaw within it,
    the peer behind absolute beyond it on test2016 and within it on validation, the rule choosing as on the
    one-commit columns; xl with attention dropout 0.1 (seed 3) within directional's seeds and above its dropout-0
    seeds on validation, below absolute's seeds and its dropout-0 seeds on test2016."""
    runs = {}
    for path in (report.TWENTY_EPOCHS_ONE_COMMIT, report.TWENTY_EPOCHS_SEED_3):
        for system, system_runs in report.read(path)["runs"].items():
            for run in system_runs:
                runs.setdefault((path, system), []).append(run["scores"]["averaged"])

    def pooled(system: str, split: str) -> list[float]:
        return [scores[split]["bleu"] for path in (report.TWENTY_EPOCHS_ONE_COMMIT, report.TWENTY_EPOCHS_SEED_3)
                for scores in runs[(path, system)]]

    for split in ("test", "validation"):
        absolute = pooled("absolute", split)
        assert len(absolute) == 3
        assert min(pooled("directional", split)) > max(absolute)
        assert overlaps(pooled("rope", split), absolute) and overlaps(pooled("shaw", split), absolute)
    assert max(pooled("peer+recipe-training", "test")) < min(pooled("absolute", "test"))
    assert overlaps(pooled("peer+recipe-training", "validation"), pooled("absolute", "validation"))
    assert (report.choose_default(report.default_rule_columns((report.TWENTY_EPOCHS_ONE_COMMIT,
                                                               report.TWENTY_EPOCHS_SEED_3)))[0]
            == report.choose_default(report.default_rule_columns())[0])
    xl_dropout_0 = runs[(report.TWENTY_EPOCHS_ONE_COMMIT, "xl")]
    [xl] = runs[(report.TWENTY_EPOCHS_SEED_3, "xl")]
    directional = pooled("directional", "validation")
    assert min(directional) <= xl["validation"]["bleu"] <= max(directional)
    assert xl["validation"]["bleu"] > max(scores["validation"]["bleu"] for scores in xl_dropout_0)
    assert xl["test"]["bleu"] < min(pooled("absolute", "test"))
    assert xl["test"]["bleu"] < min(scores["test"]["bleu"] for scores in xl_dropout_0)
    # the earlier record's xl, attention dropout 0.1: above the dropout-0 seeds on validation, as seed 3 is; on
    # test2016 above absolute's seeds and the dropout-0 seeds, where seed 3 is below both
    earlier = [run["scores"]["averaged"] for run in
               report.read("convergence/recipes_seeds_1_2/convergence.json")["runs"]["xl"]]
    assert min(scores["validation"]["bleu"] for scores in earlier) > max(
        scores["validation"]["bleu"] for scores in xl_dropout_0)
    assert min(scores["test"]["bleu"] for scores in earlier) > max(
        *pooled("absolute", "test"), *(scores["test"]["bleu"] for scores in xl_dropout_0))


def test_the_three_seed_rule_outcome_says_which_twenty_epoch_columns_enter(report):
    """docs/results.md 5, three seeds: the rule's outcome with the three-seed 20-epoch columns is stated over the
    columns that enter it. `xl` has seed 3 alone there (its seeds 1 and 2 ran another recipe), so by MIN_SEEDS both
    20-epoch columns are set aside as they are, and the passage says so; with `xl`'s one seed left out of them (the
    one-commit columns have no `xl`), both enter and the rule chooses as on the one-commit columns, which the
    passage and the prose say."""
    columns = report.default_rule_columns((report.TWENTY_EPOCHS_ONE_COMMIT, report.TWENTY_EPOCHS_SEED_3))
    twenty = [name for name in columns if name.startswith("20 epochs, ")]
    assert len(twenty) == 2 and not any(name in report.ranked_columns(columns) for name in twenty)
    without_one_seed = {name: {scheme: seeds for scheme, seeds in column.items() if len(seeds) >= report.MIN_SEEDS}
                        if name in twenty else column for name, column in columns.items()}
    assert all(name in report.ranked_columns(without_one_seed) for name in twenty)
    before = report.choose_default(report.default_rule_columns())[0]
    assert report.choose_default(without_one_seed)[0] == before
    passage = report.results_convergence_three_seeds()
    assert (f"set aside both 20-epoch columns ({report.MIN_SEEDS} seeds a scheme at least; `xl` has 1), so the "
            f"outcome, **`{report.choose_default(columns)[0]}`**, rests on the other columns; with `xl`'s one seed "
            f"left out of them, as the one-commit columns have no `xl`, both enter and the rule chooses "
            f"**`{before}`**.") in passage
    assert ("the rule for the default chooses as before once `xl`'s one seed is left out of the 20-epoch columns "
            "(with it, they are set aside)" in page_text("docs/results.md"))


def test_the_twenty_epoch_long_input_reading_holds_in_the_record(report):
    """docs/results.md 5b, the recipes after 20 epochs (seed 3): at 4 captions as one sentence shaw keeps the largest
    share and rope the smallest, both sets, each the one system significantly ahead of / behind absolute there; shaw
    never at the cap; on single captions only the peer on test2016 differs significantly; the best share < 50 %."""
    record = report.read(report.LONG_INPUTS_TWENTY_EPOCHS_SEED_3)
    tests = record["paired_tests"]["systems"]

    def significant(level: str, sign: int) -> list[str]:
        return [system for system, levels in tests.items()
                if any(test["p_value"] < 0.05 and sign * test["difference"] > 0 for test in levels[level].values())]

    for name in ("test2016", "validation"):
        level = f"{name}: 4 as one sentence"
        kept = {system: statistics.mean(report.long_inputs.bleu_kept(record, level, system))
                for system in record["levels"][level]}
        assert max(kept, key=kept.get) == "shaw" and min(kept, key=kept.get) == "rope"
        assert max(kept.values()) < 50
        assert significant(level, +1) == ["shaw"] and significant(level, -1) == ["rope"]
        assert significant(f"{name}: 1 caption", +1) == []
        assert significant(f"{name}: 1 caption", -1) == (["peer+recipe-training"] if name == "test2016" else [])
    assert all(count == 0 for level in record["levels"].values() for count in level["shaw"]["at_cap"])
