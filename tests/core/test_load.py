"""Loading specs: every error names file:line:column and the field, and affects only its own app."""

from __future__ import annotations

from pathlib import Path

from reconciler.errors import SpecLimitError
from reconciler.spec.load import MAX_FILE_BYTES, load_dir, load_files

GOOD = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  job:
    jarURI: jobs/counter.jar
"""


def test_examples_repo_is_valid() -> None:
    result = load_dir(Path(__file__).parents[2] / "examples-repo")
    assert result.errors == ()
    assert set(result.apps) == {"orders", "clicks", "sampler", "archive"}
    modes = {a.app.spec.job.upgrade_mode.value for a in result.apps.values()}
    assert modes == {"savepoint", "last-state", "stateless"}


def test_unknown_field_names_line_column_and_suggests() -> None:
    text = GOOD.format(name="orders") + "    paralelism: 2\n"
    result = load_files({"apps/orders.yaml": text.encode()})
    (err,) = result.errors
    assert (err.file, err.line, err.column, err.field, err.app) == (
        "apps/orders.yaml", 8, 5, "spec.job.paralelism", "orders")
    assert "did you mean 'parallelism'" in str(err)
    assert str(err).startswith("apps/orders.yaml:8:5 spec.job.paralelism:")
    assert result.apps == {}


def test_bad_value_points_at_its_key() -> None:
    text = GOOD.format(name="orders") + "    upgradeMode: savepoints\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert (err.line, err.field) == (8, "spec.job.upgradeMode")
    assert "'savepoint', 'last-state' or 'stateless'" in err.message


def test_bad_file_invalidates_only_its_own_apps() -> None:
    files = {
        "apps/good.yaml": GOOD.format(name="good").encode(),
        "apps/multi.yaml": (GOOD.format(name="fine") + "---\n" + GOOD.format(name="Not_Dns")).encode(),
        "apps/syntax.yaml": b"apiVersion: [unclosed\n",
    }
    result = load_files(files)
    assert set(result.apps) == {"good", "fine"}
    assert result.broken_files == {"apps/multi.yaml", "apps/syntax.yaml"}
    by_file = {e.file: e for e in result.errors}
    assert by_file["apps/multi.yaml"].line == 12 and by_file["apps/multi.yaml"].field == "metadata.name"
    assert by_file["apps/syntax.yaml"].line == 2 and "invalid YAML" in by_file["apps/syntax.yaml"].message


def test_duplicate_app_names_are_an_error_for_both_files() -> None:
    result = load_files({"a.yaml": GOOD.format(name="x").encode(), "b.yaml": GOOD.format(name="x").encode()})
    assert result.apps == {}
    assert {e.file for e in result.errors} == {"a.yaml", "b.yaml"}
    assert all("duplicate app name 'x'" in e.message and e.line == 1 for e in result.errors)


def test_duplicate_keys_are_an_error_not_last_wins() -> None:
    text = GOOD.format(name="x") + "    jarURI: other.jar\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert "duplicate key 'jarURI'" in err.message and err.line == 8


def test_yaml_12_scalars_norway_stays_a_string() -> None:
    text = GOOD.format(name="x") + "    args: [no, on, yes, '007']\n  flinkConfiguration: {x: off}\n"
    app = load_files({"a.yaml": text.encode()}).apps["x"].app
    assert app.spec.job.args == ("no", "on", "yes", "007")
    assert app.spec.flink_configuration == {"x": "off"}


def test_alias_bomb_fails_fast_and_clearly() -> None:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1}]"
              for i in range(1, 10)]
    bomb = "\n".join(lines) + "\napiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\n"
    (err,) = load_files({"bomb.yaml": bomb.encode()}).errors
    assert isinstance(err, SpecLimitError) and "alias bomb" in err.message and err.file == "bomb.yaml"


def test_huge_file_is_refused_before_parsing() -> None:
    (err,) = load_files({"big.yaml": b"#" * (MAX_FILE_BYTES + 1)}).errors
    assert isinstance(err, SpecLimitError) and "limited to" in err.message


def test_not_a_flinkapp_gets_one_clear_error() -> None:
    (err,) = load_files({"cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}).errors
    assert err.message == "apiVersion must be 'flink-reconciler.io/v1alpha1' (got 'v1')" and err.line == 1


def test_empty_documents_and_missing_required_fields() -> None:
    text = "---\n---\napiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\nmetadata: {name: x}\nspec: {}\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert err.message == "required field 'job' is missing" and err.field == "spec.job" and err.line == 6


def test_parallelism_beyond_slots_is_rejected() -> None:
    text = GOOD.format(name="x") + "    parallelism: 3\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert "exceeds the task slots" in err.message and err.field == "spec"
