"""Train and evaluate a RelPosTransformer translation model.

    python train_translation.py configs/demo.yaml
    python train_translation.py configs/wmt14_en_de_base_shaw.yaml --max_steps 1000 --model.dropout 0.2
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml train_translation.py configs/NAME.yaml

See docs/training.md for every recipe and field.
"""

from hf_relpos.translation.training import main

if __name__ == "__main__":
    main()
