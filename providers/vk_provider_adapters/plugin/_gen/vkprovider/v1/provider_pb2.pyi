import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProviderErrorDetail(_message.Message):
    __slots__ = ("kind", "message", "retry_after_seconds", "field")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ProviderErrorDetail.Kind]
        NOT_FOUND: _ClassVar[ProviderErrorDetail.Kind]
        CAPACITY_UNAVAILABLE: _ClassVar[ProviderErrorDetail.Kind]
        RATE_LIMITED: _ClassVar[ProviderErrorDetail.Kind]
        TRANSIENT: _ClassVar[ProviderErrorDetail.Kind]
        INVALID_SPEC: _ClassVar[ProviderErrorDetail.Kind]
        AUTH_FAILED: _ClassVar[ProviderErrorDetail.Kind]
    KIND_UNSPECIFIED: ProviderErrorDetail.Kind
    NOT_FOUND: ProviderErrorDetail.Kind
    CAPACITY_UNAVAILABLE: ProviderErrorDetail.Kind
    RATE_LIMITED: ProviderErrorDetail.Kind
    TRANSIENT: ProviderErrorDetail.Kind
    INVALID_SPEC: ProviderErrorDetail.Kind
    AUTH_FAILED: ProviderErrorDetail.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    kind: ProviderErrorDetail.Kind
    message: str
    retry_after_seconds: float
    field: str
    def __init__(self, kind: _Optional[_Union[ProviderErrorDetail.Kind, str]] = ..., message: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ..., field: _Optional[str] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("logs", "follow_logs", "log_timestamps", "previous_logs", "multi_container", "init_containers", "sidecars", "usage", "probes", "restart_container")
    LOGS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_LOGS_FIELD_NUMBER: _ClassVar[int]
    LOG_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LOGS_FIELD_NUMBER: _ClassVar[int]
    MULTI_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    INIT_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    SIDECARS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    RESTART_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    logs: bool
    follow_logs: bool
    log_timestamps: bool
    previous_logs: bool
    multi_container: bool
    init_containers: bool
    sidecars: bool
    usage: bool
    probes: str
    restart_container: bool
    def __init__(self, logs: _Optional[bool] = ..., follow_logs: _Optional[bool] = ..., log_timestamps: _Optional[bool] = ..., previous_logs: _Optional[bool] = ..., multi_container: _Optional[bool] = ..., init_containers: _Optional[bool] = ..., sidecars: _Optional[bool] = ..., usage: _Optional[bool] = ..., probes: _Optional[str] = ..., restart_container: _Optional[bool] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("name", "capabilities")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    capabilities: Capabilities
    def __init__(self, name: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ...) -> None: ...

class OffersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OffersResponse(_message.Message):
    __slots__ = ("offers",)
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    offers: _containers.RepeatedCompositeFieldContainer[Offer]
    def __init__(self, offers: _Optional[_Iterable[_Union[Offer, _Mapping]]] = ...) -> None: ...

class Offer(_message.Message):
    __slots__ = ("provider", "sku", "region", "gpu_model", "gpu_count", "gpu_memory_gib", "vcpus", "memory_gib", "price_per_hour", "spot", "available", "startup_seconds")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    provider: str
    sku: str
    region: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    vcpus: float
    memory_gib: float
    price_per_hour: float
    spot: bool
    available: int
    startup_seconds: float
    def __init__(self, provider: _Optional[str] = ..., sku: _Optional[str] = ..., region: _Optional[str] = ..., gpu_model: _Optional[str] = ..., gpu_count: _Optional[int] = ..., gpu_memory_gib: _Optional[float] = ..., vcpus: _Optional[float] = ..., memory_gib: _Optional[float] = ..., price_per_hour: _Optional[float] = ..., spot: _Optional[bool] = ..., available: _Optional[int] = ..., startup_seconds: _Optional[float] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value", "secret")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    secret: bool
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., secret: _Optional[bool] = ...) -> None: ...

class Port(_message.Message):
    __slots__ = ("container_port", "protocol", "name")
    CONTAINER_PORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    container_port: int
    protocol: str
    name: str
    def __init__(self, container_port: _Optional[int] = ..., protocol: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Probe(_message.Message):
    __slots__ = ("kind", "command", "port", "host", "path", "scheme", "headers", "grpc_service", "initial_delay_seconds", "period_seconds", "timeout_seconds", "success_threshold", "failure_threshold")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    GRPC_SERVICE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FAILURE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    kind: str
    command: _containers.RepeatedScalarFieldContainer[str]
    port: int
    host: str
    path: str
    scheme: str
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    grpc_service: str
    initial_delay_seconds: int
    period_seconds: int
    timeout_seconds: int
    success_threshold: int
    failure_threshold: int
    def __init__(self, kind: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., port: _Optional[int] = ..., host: _Optional[str] = ..., path: _Optional[str] = ..., scheme: _Optional[str] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., grpc_service: _Optional[str] = ..., initial_delay_seconds: _Optional[int] = ..., period_seconds: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., success_threshold: _Optional[int] = ..., failure_threshold: _Optional[int] = ...) -> None: ...

class ContainerSpec(_message.Message):
    __slots__ = ("name", "image", "command", "args", "env", "ports", "working_dir", "cpu", "memory_bytes", "gpu_count", "restart_policy", "startup_probe", "readiness_probe", "liveness_probe", "volume_mounts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESTART_POLICY_FIELD_NUMBER: _ClassVar[int]
    STARTUP_PROBE_FIELD_NUMBER: _ClassVar[int]
    READINESS_PROBE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_PROBE_FIELD_NUMBER: _ClassVar[int]
    VOLUME_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    ports: _containers.RepeatedCompositeFieldContainer[Port]
    working_dir: str
    cpu: float
    memory_bytes: int
    gpu_count: int
    restart_policy: str
    startup_probe: Probe
    readiness_probe: Probe
    liveness_probe: Probe
    volume_mounts: _containers.RepeatedCompositeFieldContainer[VolumeMount]
    def __init__(self, name: _Optional[str] = ..., image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., ports: _Optional[_Iterable[_Union[Port, _Mapping]]] = ..., working_dir: _Optional[str] = ..., cpu: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., gpu_count: _Optional[int] = ..., restart_policy: _Optional[str] = ..., startup_probe: _Optional[_Union[Probe, _Mapping]] = ..., readiness_probe: _Optional[_Union[Probe, _Mapping]] = ..., liveness_probe: _Optional[_Union[Probe, _Mapping]] = ..., volume_mounts: _Optional[_Iterable[_Union[VolumeMount, _Mapping]]] = ...) -> None: ...

class VolumeMount(_message.Message):
    __slots__ = ("volume", "mount_path", "read_only", "sub_path")
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SUB_PATH_FIELD_NUMBER: _ClassVar[int]
    volume: str
    mount_path: str
    read_only: bool
    sub_path: str
    def __init__(self, volume: _Optional[str] = ..., mount_path: _Optional[str] = ..., read_only: _Optional[bool] = ..., sub_path: _Optional[str] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class WorkloadSpec(_message.Message):
    __slots__ = ("pod_uid", "namespace", "pod_name", "gpu_count", "gpu_models", "min_gpu_memory_gib", "cpu", "memory_bytes", "labels", "attempt", "containers", "init_containers", "restart_policy")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    INIT_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    RESTART_POLICY_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    namespace: str
    pod_name: str
    gpu_count: int
    gpu_models: _containers.RepeatedScalarFieldContainer[str]
    min_gpu_memory_gib: float
    cpu: float
    memory_bytes: int
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    attempt: int
    containers: _containers.RepeatedCompositeFieldContainer[ContainerSpec]
    init_containers: _containers.RepeatedCompositeFieldContainer[ContainerSpec]
    restart_policy: str
    def __init__(self, pod_uid: _Optional[str] = ..., namespace: _Optional[str] = ..., pod_name: _Optional[str] = ..., gpu_count: _Optional[int] = ..., gpu_models: _Optional[_Iterable[str]] = ..., min_gpu_memory_gib: _Optional[float] = ..., cpu: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., attempt: _Optional[int] = ..., containers: _Optional[_Iterable[_Union[ContainerSpec, _Mapping]]] = ..., init_containers: _Optional[_Iterable[_Union[ContainerSpec, _Mapping]]] = ..., restart_policy: _Optional[str] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("spec", "offer")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    OFFER_FIELD_NUMBER: _ClassVar[int]
    spec: WorkloadSpec
    offer: Offer
    def __init__(self, spec: _Optional[_Union[WorkloadSpec, _Mapping]] = ..., offer: _Optional[_Union[Offer, _Mapping]] = ...) -> None: ...

class Termination(_message.Message):
    __slots__ = ("exit_code", "reason", "message", "started_at", "finished_at")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    reason: str
    message: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ContainerStatus(_message.Message):
    __slots__ = ("name", "state", "reason", "message", "exit_code", "started_at", "finished_at", "restart_count", "last_termination", "ready", "started")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[ContainerStatus.State]
        WAITING: _ClassVar[ContainerStatus.State]
        RUNNING: _ClassVar[ContainerStatus.State]
        TERMINATED: _ClassVar[ContainerStatus.State]
    STATE_UNSPECIFIED: ContainerStatus.State
    WAITING: ContainerStatus.State
    RUNNING: ContainerStatus.State
    TERMINATED: ContainerStatus.State
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_TERMINATION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: ContainerStatus.State
    reason: str
    message: str
    exit_code: int
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    restart_count: int
    last_termination: Termination
    ready: bool
    started: bool
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[ContainerStatus.State, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., restart_count: _Optional[int] = ..., last_termination: _Optional[_Union[Termination, _Mapping]] = ..., ready: _Optional[bool] = ..., started: _Optional[bool] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("provider", "instance_id", "pod_uid", "attempt", "state", "offer_key", "exit_code", "message", "started_at", "finished_at", "ip", "price_per_hour", "containers", "init_containers", "endpoints")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Instance.State]
        PENDING: _ClassVar[Instance.State]
        RUNNING: _ClassVar[Instance.State]
        EXITED: _ClassVar[Instance.State]
        TERMINATING: _ClassVar[Instance.State]
        TERMINATED: _ClassVar[Instance.State]
        LOST: _ClassVar[Instance.State]
    STATE_UNSPECIFIED: Instance.State
    PENDING: Instance.State
    RUNNING: Instance.State
    EXITED: Instance.State
    TERMINATING: Instance.State
    TERMINATED: Instance.State
    LOST: Instance.State
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OFFER_KEY_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    INIT_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    provider: str
    instance_id: str
    pod_uid: str
    attempt: int
    state: Instance.State
    offer_key: str
    exit_code: int
    message: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    ip: str
    price_per_hour: float
    containers: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    init_containers: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    endpoints: _containers.RepeatedCompositeFieldContainer[PortEndpoint]
    def __init__(self, provider: _Optional[str] = ..., instance_id: _Optional[str] = ..., pod_uid: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[Instance.State, str]] = ..., offer_key: _Optional[str] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ip: _Optional[str] = ..., price_per_hour: _Optional[float] = ..., containers: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., init_containers: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., endpoints: _Optional[_Iterable[_Union[PortEndpoint, _Mapping]]] = ...) -> None: ...

class PortEndpoint(_message.Message):
    __slots__ = ("container_port", "protocol", "address", "port")
    CONTAINER_PORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    container_port: int
    protocol: str
    address: str
    port: int
    def __init__(self, container_port: _Optional[int] = ..., protocol: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("instance_id", "grace_seconds")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    grace_seconds: float
    def __init__(self, instance_id: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListOursRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListOursResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("instance_id", "tail_lines", "follow", "timestamps", "since_seconds", "limit_bytes", "container", "previous")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    tail_lines: int
    follow: bool
    timestamps: bool
    since_seconds: int
    limit_bytes: int
    container: str
    previous: bool
    def __init__(self, instance_id: _Optional[str] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ..., timestamps: _Optional[bool] = ..., since_seconds: _Optional[int] = ..., limit_bytes: _Optional[int] = ..., container: _Optional[str] = ..., previous: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class ContainerUsage(_message.Message):
    __slots__ = ("name", "cpu_core_nanoseconds", "memory_working_set_bytes", "timestamp")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CPU_CORE_NANOSECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_WORKING_SET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    name: str
    cpu_core_nanoseconds: int
    memory_working_set_bytes: int
    timestamp: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., cpu_core_nanoseconds: _Optional[int] = ..., memory_working_set_bytes: _Optional[int] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UsageResponse(_message.Message):
    __slots__ = ("containers",)
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    containers: _containers.RepeatedCompositeFieldContainer[ContainerUsage]
    def __init__(self, containers: _Optional[_Iterable[_Union[ContainerUsage, _Mapping]]] = ...) -> None: ...

class RestartContainerRequest(_message.Message):
    __slots__ = ("instance_id", "container")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    container: str
    def __init__(self, instance_id: _Optional[str] = ..., container: _Optional[str] = ...) -> None: ...

class RestartContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
