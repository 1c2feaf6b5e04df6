"""LeRobot 0.4.4's own training entry point (``lerobot-train``), after ``lerobot_compat.apply()``.

    .venv-train/bin/python examples/train_arm/lerobot_train_cpu.py --dataset.repo_id=local/arm_reach ...

Same command-line flags as ``lerobot-train``; the only difference is the CPU-torchvision
workaround, which must run before LeRobot is imported.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lerobot_compat  # noqa: E402

lerobot_compat.apply()

from lerobot.scripts.lerobot_train import main  # noqa: E402

if __name__ == "__main__":
    main()
