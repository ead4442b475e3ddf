// Entry point for callers that depend on this package instead of copying
// src/gen: the whole inferwire.v1 API, plus the standard grpc.health.v1 and
// google.rpc types a caller needs around it. Those are named one by one
// because every generated file exports the same helper names
// (protobufPackage, MessageFns, DeepPartial...).
export * from "./gen/inferwire/v1/inference";
export {
  HealthCheckRequest,
  HealthCheckResponse,
  HealthCheckResponse_ServingStatus,
  healthCheckResponse_ServingStatusToJSON,
  HealthClient,
} from "./gen/health/v1/health";
export { Status } from "./gen/google/rpc/status";
export { BadRequest, BadRequest_FieldViolation } from "./gen/google/rpc/error_details";
