"""Key map of LPIPS-VGG16 <-> `glmrl.models.lpips.LPIPS`.

Two published files feed one model: torchvision's `vgg16` state_dict (`features.{0,2,5,...}.weight`
/ `.bias`; its `classifier.*` keys are not part of LPIPS and are dropped by the converter) and the
`lpips` package's `weights/v0.1/vgg.pth` (`lin{l}.model.1.weight`, 1x1 convs without bias; index 0
of `model` is a parameter-free Dropout).
"""

from checkpoints_convert.rules import CONV2D, IDENTITY, Rule
from glmrl.models.vgg import torchvision_conv_indices

# torchvision keys the LPIPS model does not use (VGG16's fully connected classifier).
IGNORED_PREFIXES = ("classifier.",)

RULES = tuple(
    rule
    for k, tv in enumerate(torchvision_conv_indices())
    for rule in (Rule(f"features.{tv}.weight", f"vgg.convs.{k}.kernel", CONV2D),
                 Rule(f"features.{tv}.bias", f"vgg.convs.{k}.bias", IDENTITY))
) + (Rule("lin{i}.model.1.weight", "heads.{i}.kernel", CONV2D),)
