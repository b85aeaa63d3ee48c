"""Packaging for adaptkit: metadata and requirements come from settings.ini (read with configparser)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

here = Path(__file__).parent
cfg = ConfigParser(delimiters=["="])
cfg.read(here / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

licenses = {"apache2": ("Apache-2.0", "OSI Approved :: Apache Software License")}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable", "6 - Mature"]
py_versions = ["3.10", "3.11", "3.12", "3.13"]
lic = licenses[cfg["license"]]
min_python = cfg["min_python"]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=(here / "README.md").read_text(encoding="utf-8") if (here / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    url=cfg["git_url"],
    license=lic[0],
    keywords=cfg["keywords"].split(),
    classifiers=[
        f"Development Status :: {statuses[int(cfg['status']) - 1]}",
        f"Intended Audience :: {cfg['audience'].title()}",
        f"License :: {lic[1]}",
        f"Natural Language :: {cfg['language'].title()}",
    ]
    + [f"Programming Language :: Python :: {v}" for v in py_versions[py_versions.index(min_python):]],
    packages=setuptools.find_packages(include=[cfg["lib_name"], f"{cfg['lib_name']}.*"]),
    include_package_data=True,
    # each method's card template beside its code, the plain checkpoint's in hub/, the stored CLI help
    package_data={"": ["card.md", "checkpoint.md"], cfg["lib_name"]: ["cli_help.json"]},
    python_requires=f">={min_python}",
    install_requires=cfg["requirements"].split(),
    extras_require={"dev": cfg["dev_requirements"].split(), "vllm": cfg["optional_requirements"].split()},
    entry_points={"console_scripts": cfg["console_scripts"].split(), "nbdev": [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"]},
    zip_safe=False,
)
