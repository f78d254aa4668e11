"""horovod.tensorflow.keras.callbacks on kolo, for TensorFlow's Keras (tf.keras): kolo._keras's
callbacks (BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
LearningRateWarmupCallback) made on tf.keras.callbacks.Callback. kolo.keras.callbacks makes the
same classes on standalone Keras 3."""

import tensorflow as tf

from kolo._keras import make_callbacks

_classes = make_callbacks(tf.keras)
BroadcastGlobalVariablesCallback = _classes["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _classes["MetricAverageCallback"]
LearningRateScheduleCallback = _classes["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _classes["LearningRateWarmupCallback"]
