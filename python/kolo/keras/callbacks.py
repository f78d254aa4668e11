"""horovod.keras.callbacks on kolo: kolo.tensorflow.keras.callbacks' classes, made on standalone
Keras 3's Callback."""

import keras

from kolo.tensorflow.keras.callbacks import make_callbacks

_classes = make_callbacks(keras)
BroadcastGlobalVariablesCallback = _classes["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _classes["MetricAverageCallback"]
LearningRateScheduleCallback = _classes["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _classes["LearningRateWarmupCallback"]
