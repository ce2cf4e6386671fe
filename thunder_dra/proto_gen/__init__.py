"""Generated gRPC stubs for the kubelet plugin protocols in proto/ (release/gen-proto.sh).

Do not edit; regenerate. Modules: pluginregistration_v1, dra_v1, dra_v1beta1,
dra_health_v1, dra_health_v1alpha1, each as ``<name>_pb2`` (messages) and
``<name>_pb2_grpc`` (services).
"""
