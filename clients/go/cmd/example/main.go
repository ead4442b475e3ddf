// Command example calls a running inferwire server through the generated Go
// client: a unary Infer, a streamed InferStream, the standard grpc.health.v1
// Check for one model, and an invalid request whose google.rpc.BadRequest
// details it decodes.
//
// Usage: example [host:port] [model]   (defaults: localhost:50051 demo)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	inferwirev1 "github.com/inferwire/inferwire/clients/go/inferwire/v1"
)

func main() {
	address, model := "localhost:50051", "demo"
	if len(os.Args) > 1 {
		address = os.Args[1]
	}
	if len(os.Args) > 2 {
		model = os.Args[2]
	}
	if err := run(address, model); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run(address, model string) error {
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := inferwirev1.NewInferenceServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := infer(ctx, client, model); err != nil {
		return fmt.Errorf("Infer: %w", err)
	}
	if err := inferStream(ctx, client, model); err != nil {
		return fmt.Errorf("InferStream: %w", err)
	}
	if err := checkHealth(ctx, healthpb.NewHealthClient(conn), model); err != nil {
		return fmt.Errorf("Health/Check: %w", err)
	}
	if err := showBadRequest(ctx, client, model); err != nil {
		return fmt.Errorf("invalid request: %w", err)
	}
	return nil
}

func infer(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	resp, err := client.Infer(ctx, &inferwirev1.InferRequest{
		Model:      model,
		Prompt:     "Once upon a time",
		Parameters: &inferwirev1.GenerationParameters{MaxTokens: proto.Int32(16)},
	})
	if err != nil {
		return err
	}
	fmt.Println("INFER", strconv.Quote(resp.GetText()))
	return nil
}

func inferStream(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	stream, err := client.InferStream(ctx, &inferwirev1.InferStreamRequest{
		Model:      model,
		Prompt:     "Once upon a time",
		Parameters: &inferwirev1.GenerationParameters{MaxTokens: proto.Int32(24)},
	})
	if err != nil {
		return err
	}
	deltas := 0
	finish := inferwirev1.FinishReason_FINISH_REASON_UNSPECIFIED
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if msg.GetText() != "" {
			deltas++
			fmt.Println("DELTA", strconv.Quote(msg.GetText()))
		}
		if msg.GetFinishReason() != inferwirev1.FinishReason_FINISH_REASON_UNSPECIFIED {
			finish = msg.GetFinishReason()
		}
	}
	fmt.Printf("STREAM_END finish_reason=%s deltas=%d\n", finish, deltas)
	return nil
}

func checkHealth(ctx context.Context, health healthpb.HealthClient, model string) error {
	service := "model/" + model
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	fmt.Println("HEALTH", service, resp.GetStatus())
	return nil
}

// showBadRequest sends top_p = 1.5 and prints the status code and each
// google.rpc.BadRequest field violation the server attached to the error.
func showBadRequest(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	_, err := client.Infer(ctx, &inferwirev1.InferRequest{
		Model:      model,
		Prompt:     "Once upon a time",
		Parameters: &inferwirev1.GenerationParameters{TopP: proto.Float32(1.5)},
	})
	if err == nil {
		return errors.New("the server accepted top_p = 1.5")
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return fmt.Errorf("want INVALID_ARGUMENT, got %w", err)
	}
	// codes.Code prints as "InvalidArgument"; google.rpc.Code has the canonical name.
	codeName := code.Code(st.Code()).String()
	violations := 0
	for _, detail := range st.Details() {
		badRequest, ok := detail.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, v := range badRequest.GetFieldViolations() {
			violations++
			fmt.Printf("ERROR code=%s field=%s description=%s\n", codeName, v.GetField(), v.GetDescription())
		}
	}
	if violations == 0 {
		return fmt.Errorf("no google.rpc.BadRequest field violations in %v", st.Proto())
	}
	return nil
}
