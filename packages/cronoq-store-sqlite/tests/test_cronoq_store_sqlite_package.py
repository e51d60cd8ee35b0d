from pathlib import Path

import cronoq_store_sqlite


def test_package_is_installed_with_type_information() -> None:
    assert (Path(cronoq_store_sqlite.__file__).parent / "py.typed").is_file()
