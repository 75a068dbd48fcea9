#!/usr/bin/env bash
# Downloads into FOLDER (default .whl) the wheels a lent GPU machine's image lacks for the GPU check and the
# experiments: its Python is 3.12 with torch, triton, accelerate, tokenizers, sacrebleu and pyarrow, but an older
# transformers and no datasets (the device tool's KINDS.md lists the image). The versions are those CI runs (and
# what datasets needs beside them). On the machine, before the check:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#       && export PYTHONPATH=/tmp/site:.
set -euo pipefail
folder=${1:-.whl}
mkdir -p "$folder"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$folder" transformers==5.24.0 datasets==5.2.0 peft==0.21.2 "dill<0.4.2,>=0.3.0" "multiprocess<0.70.20"
ls "$folder"
