from pathlib import Path

import cronoq_conformance


def test_package_is_installed_with_type_information() -> None:
    assert (Path(cronoq_conformance.__file__).parent / "py.typed").is_file()
