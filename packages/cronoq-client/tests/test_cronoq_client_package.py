from pathlib import Path

import cronoq_client


def test_package_is_installed_with_type_information() -> None:
    assert (Path(cronoq_client.__file__).parent / "py.typed").is_file()
