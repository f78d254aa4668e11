"""horovod.keras.callbacks on kolo: kolo._keras's callbacks made on standalone Keras 3's Callback,
for any backend kolo.keras serves (they use kolo's ops on numpy arrays)."""

import keras

from kolo._keras import make_callbacks

_classes = make_callbacks(keras)
BroadcastGlobalVariablesCallback = _classes["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _classes["MetricAverageCallback"]
LearningRateScheduleCallback = _classes["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _classes["LearningRateWarmupCallback"]
