// Command example calls a running inferwire server through the generated Go
// client: a unary Infer, a streamed InferStream, the standard grpc.health.v1
// Check for one model, an invalid request whose google.rpc.BadRequest details
// it decodes, and a chat request with log-probabilities. The unary Infer waits
// out a RESOURCE_EXHAUSTED as long as its google.rpc.RetryInfo asks (a tenant
// quota), then tries again.
//
// Usage: example [flags] [host:port] [model]   (defaults: localhost:50051 demo)
//
// Without flags it connects in plaintext. For a server with TLS or mutual TLS,
// and one that wants a token:
//
//	-tls-ca PATH    PEM CA certificates to verify the server with; turns TLS on ($INFERWIRE_TLS_CA)
//	-tls-cert PATH  PEM client certificate, for mutual TLS, with -tls-key ($INFERWIRE_TLS_CERT)
//	-tls-key PATH   its PEM private key ($INFERWIRE_TLS_KEY)
//	-token TOKEN    sent as "authorization: Bearer TOKEN" on every call; TLS only ($INFERWIRE_TOKEN)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
	"unicode/utf16"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	inferwirev1 "github.com/inferwire/inferwire/clients/go/inferwire/v1"
)

// The chat request every language's example sends: greedy, so that the tokens
// and their log-probabilities are the same from every client.
const (
	chatSystem  = "You are a player in a Shakespeare play."
	chatUser    = "Good morrow! What news from Verona?"
	topLogprobs = 3
)

// security holds the TLS files and the token; all empty means plaintext.
type security struct {
	caFile, certFile, keyFile, token string
}

func main() {
	var sec security
	flag.StringVar(&sec.caFile, "tls-ca", os.Getenv("INFERWIRE_TLS_CA"), "PEM CA certificates to verify the server with; turns TLS on")
	flag.StringVar(&sec.certFile, "tls-cert", os.Getenv("INFERWIRE_TLS_CERT"), "PEM client certificate for mutual TLS (with -tls-key)")
	flag.StringVar(&sec.keyFile, "tls-key", os.Getenv("INFERWIRE_TLS_KEY"), "PEM private key of -tls-cert")
	flag.StringVar(&sec.token, "token", os.Getenv("INFERWIRE_TOKEN"), "bearer token sent on every call (needs TLS)")
	lb := flag.String("lb", "", "load-balancing policy, e.g. round_robin with a dns:///host:port target, to spread calls over every address of a Service")
	flag.Parse()
	address, model := "localhost:50051", "demo"
	if flag.NArg() > 0 {
		address = flag.Arg(0)
	}
	if flag.NArg() > 1 {
		model = flag.Arg(1)
	}
	if err := run(address, model, sec, *lb); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run(address, model string, sec security, lb string) error {
	dialOptions, err := sec.dialOptions()
	if err != nil {
		return err
	}
	if lb != "" {
		// A service config picks the policy; with dns:/// the resolver returns every
		// address of the name (one per replica behind a headless Service).
		config := fmt.Sprintf(`{"loadBalancingConfig":[{%q:{}}]}`, lb)
		dialOptions = append(dialOptions, grpc.WithDefaultServiceConfig(config))
	}
	conn, err := grpc.NewClient(address, dialOptions...)
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
	if err := chatWithLogprobs(ctx, client, model); err != nil {
		return fmt.Errorf("chat Infer: %w", err)
	}
	if err := callTool(ctx, client, model); err != nil {
		return fmt.Errorf("tool Infer: %w", err)
	}
	return nil
}

// weatherSchema is the get_weather tool's parameters, as JSON Schema.
const weatherSchema = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}`

// callTool offers one tool and requires a call: where the model's capabilities
// say tools_constrained, the arguments are valid under the schema by construction.
func callTool(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	resp, err := client.Infer(ctx, &inferwirev1.InferRequest{
		Model:    model,
		Messages: []*inferwirev1.ChatMessage{{Role: "user", Content: "What is the weather in Verona?"}},
		Tools: []*inferwirev1.Tool{{
			Name:                 "get_weather",
			Description:          "The weather in a city",
			ParametersJsonSchema: weatherSchema,
		}},
		ToolChoice: &inferwirev1.ToolChoice{
			Choice: &inferwirev1.ToolChoice_Mode{Mode: inferwirev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
		},
		ParallelToolCalls: proto.Bool(false),
		Parameters: &inferwirev1.GenerationParameters{
			MaxTokens:   proto.Int32(96),
			Temperature: proto.Float32(0),
		},
	})
	if err != nil {
		return err
	}
	for _, call := range resp.GetToolCalls() {
		fmt.Printf("TOOL_CALL id=%s name=%s arguments=%s\n", call.GetId(), call.GetName(), call.GetArgumentsJson())
	}
	fmt.Printf("TOOL_END finish_reason=%s\n", resp.GetFinishReason())
	return nil
}

func infer(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	var resp *inferwirev1.InferResponse
	err := withQuotaRetries(ctx, 3, func() (err error) {
		resp, err = client.Infer(ctx, &inferwirev1.InferRequest{
			Model:      model,
			Prompt:     "Once upon a time",
			Parameters: &inferwirev1.GenerationParameters{MaxTokens: proto.Int32(16)},
		})
		return err
	})
	if err != nil {
		return err
	}
	fmt.Println("INFER", strconv.Quote(resp.GetText()))
	return nil
}

// retryAfter is how long a RESOURCE_EXHAUSTED error's google.rpc.RetryInfo asks
// the caller to wait (a tenant quota, or memory that cannot be freed yet); ok is
// false for any other error.
func retryAfter(err error) (delay time.Duration, ok bool) {
	st, isStatus := status.FromError(err)
	if err == nil || !isStatus || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, detail := range st.Details() {
		if info, isRetryInfo := detail.(*errdetails.RetryInfo); isRetryInfo {
			return info.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// withQuotaRetries runs call, and again after each wait a RetryInfo asks for,
// at most attempts times in all.
func withQuotaRetries(ctx context.Context, attempts int, call func() error) error {
	for attempt := 1; ; attempt++ {
		err := call()
		delay, retry := retryAfter(err)
		if !retry || attempt == attempts {
			return err
		}
		fmt.Printf("RETRY after=%.3fs\n", delay.Seconds())
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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

// chatWithLogprobs sends a system and a user message, which the model's chat
// template renders into its prompt, and prints each generated token's
// log-probability followed by its most likely alternatives.
func chatWithLogprobs(ctx context.Context, client inferwirev1.InferenceServiceClient, model string) error {
	resp, err := client.Infer(ctx, &inferwirev1.InferRequest{
		Model: model,
		Messages: []*inferwirev1.ChatMessage{
			{Role: "system", Content: chatSystem},
			{Role: "user", Content: chatUser},
		},
		Parameters: &inferwirev1.GenerationParameters{
			MaxTokens:   proto.Int32(8),
			Temperature: proto.Float32(0),
			Logprobs:    proto.Bool(true),
			TopLogprobs: proto.Uint32(topLogprobs),
		},
	})
	if err != nil {
		return err
	}
	fmt.Println("CHAT", jsonQuote(resp.GetText()))
	fmt.Printf("LOGPROBS tokens=%d top=%d\n", len(resp.GetLogprobs()), topLogprobs)
	for _, token := range resp.GetLogprobs() {
		fmt.Printf("LOGPROB %d %.4f %s\n", token.GetTokenId(), token.GetLogprob(), jsonQuote(token.GetToken()))
		for _, alternative := range token.GetTop() {
			fmt.Printf("TOP %d %.4f %s\n", alternative.GetTokenId(), alternative.GetLogprob(), jsonQuote(alternative.GetToken()))
		}
	}
	return nil
}

// jsonQuote returns text as a JSON string literal in plain ASCII (non-ASCII as
// \uXXXX escapes), the same in every language's example.
func jsonQuote(text string) string {
	var out []byte
	out = append(out, '"')
	for _, r := range text {
		switch {
		case r == '"' || r == '\\':
			out = append(out, '\\', byte(r))
		case r == '\n':
			out = append(out, `\n`...)
		case r == '\r':
			out = append(out, `\r`...)
		case r == '\t':
			out = append(out, `\t`...)
		case r >= 0x20 && r <= 0x7e:
			out = append(out, byte(r))
		case r > 0xffff:
			high, low := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, high, low)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return string(append(out, '"'))
}

// dialOptions returns plaintext transport credentials when no TLS file is given;
// otherwise TLS, verified against -tls-ca (or the system's CAs), with a client
// certificate when -tls-cert and -tls-key are given, and the token on every call.
func (sec security) dialOptions() ([]grpc.DialOption, error) {
	if sec.caFile == "" && sec.certFile == "" && sec.keyFile == "" {
		if sec.token != "" {
			return nil, errors.New("-token needs TLS (-tls-ca): a bearer token must not travel in plaintext")
		}
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if sec.caFile != "" {
		pem, err := os.ReadFile(sec.caFile)
		if err != nil {
			return nil, err
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in it", sec.caFile)
		}
	}
	if sec.certFile != "" || sec.keyFile != "" {
		pair, err := tls.LoadX509KeyPair(sec.certFile, sec.keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate (-tls-cert and -tls-key): %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	options := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(config))}
	if sec.token != "" {
		options = append(options, grpc.WithPerRPCCredentials(bearerToken(sec.token)))
	}
	return options, nil
}

// bearerToken is per-RPC credentials: gRPC adds its metadata to every call.
type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity makes gRPC refuse to send the token without TLS.
func (bearerToken) RequireTransportSecurity() bool { return true }
