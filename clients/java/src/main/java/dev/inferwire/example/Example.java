package dev.inferwire.example;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import dev.inferwire.v1.ChatMessage;
import dev.inferwire.v1.FinishReason;
import dev.inferwire.v1.GenerationParameters;
import dev.inferwire.v1.InferRequest;
import dev.inferwire.v1.InferResponse;
import dev.inferwire.v1.InferStreamRequest;
import dev.inferwire.v1.InferStreamResponse;
import dev.inferwire.v1.InferenceServiceGrpc;
import dev.inferwire.v1.TokenLogprob;
import dev.inferwire.v1.TopLogprob;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.protobuf.StatusProto;
import java.util.Iterator;
import java.util.Locale;
import java.util.concurrent.TimeUnit;

/**
 * Calls a running inferwire server through the generated Java client: a unary Infer, a streamed
 * InferStream, the standard grpc.health.v1 Check for one model, an invalid request whose
 * google.rpc.BadRequest details it decodes, and a chat request with log-probabilities.
 *
 * <p>Usage: {@code java -jar target/inferwire-client-example.jar [host:port] [model]} (defaults:
 * localhost:50051 demo).
 */
public final class Example {
  private static final long DEADLINE_SECONDS = 60;
  // The chat request every language's example sends: greedy, so that the tokens and their
  // log-probabilities are the same from every client.
  private static final String CHAT_SYSTEM = "You are a player in a Shakespeare play.";
  private static final String CHAT_USER = "Good morrow! What news from Verona?";
  private static final int TOP_LOGPROBS = 3;

  private Example() {}

  public static void main(String[] args) throws InterruptedException {
    String target = args.length > 0 ? args[0] : "localhost:50051";
    String model = args.length > 1 ? args[1] : "demo";
    ManagedChannel channel =
        Grpc.newChannelBuilder(target, InsecureChannelCredentials.create()).build();
    int exitCode = 0;
    try {
      run(channel, model);
    } catch (RuntimeException | InvalidProtocolBufferException e) {
      System.err.println("example: " + e);
      exitCode = 1;
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.exit(exitCode);
  }

  static void run(ManagedChannel channel, String model) throws InvalidProtocolBufferException {
    InferenceServiceGrpc.InferenceServiceBlockingStub client =
        InferenceServiceGrpc.newBlockingStub(channel);
    infer(client, model);
    inferStream(client, model);
    checkHealth(HealthGrpc.newBlockingStub(channel), model);
    showBadRequest(client, model);
    chatWithLogprobs(client, model);
  }

  static void infer(InferenceServiceGrpc.InferenceServiceBlockingStub client, String model) {
    InferResponse response =
        client
            .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
            .infer(
                InferRequest.newBuilder()
                    .setModel(model)
                    .setPrompt("Once upon a time")
                    .setParameters(GenerationParameters.newBuilder().setMaxTokens(16))
                    .build());
    System.out.println("INFER " + quote(response.getText()));
  }

  static void inferStream(InferenceServiceGrpc.InferenceServiceBlockingStub client, String model) {
    // The blocking iterator yields each message as it arrives; reading it to
    // the end completes the call.
    Iterator<InferStreamResponse> stream =
        client
            .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
            .inferStream(
                InferStreamRequest.newBuilder()
                    .setModel(model)
                    .setPrompt("Once upon a time")
                    .setParameters(GenerationParameters.newBuilder().setMaxTokens(24))
                    .build());
    int deltas = 0;
    FinishReason finish = FinishReason.FINISH_REASON_UNSPECIFIED;
    while (stream.hasNext()) {
      InferStreamResponse message = stream.next();
      if (!message.getText().isEmpty()) {
        deltas++;
        System.out.println("DELTA " + quote(message.getText()));
      }
      if (message.getFinishReason() != FinishReason.FINISH_REASON_UNSPECIFIED) {
        finish = message.getFinishReason();
      }
    }
    System.out.println("STREAM_END finish_reason=" + finish.name() + " deltas=" + deltas);
  }

  static void checkHealth(HealthGrpc.HealthBlockingStub health, String model) {
    String service = "model/" + model;
    HealthCheckResponse response =
        health
            .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
            .check(HealthCheckRequest.newBuilder().setService(service).build());
    System.out.println("HEALTH " + service + " " + response.getStatus().name());
  }

  /** Sends top_p = 1.5 (outside (0, 1]) and prints the BadRequest field violations. */
  static void showBadRequest(InferenceServiceGrpc.InferenceServiceBlockingStub client, String model)
      throws InvalidProtocolBufferException {
    InferRequest invalid =
        InferRequest.newBuilder()
            .setModel(model)
            .setPrompt("Once upon a time")
            .setParameters(GenerationParameters.newBuilder().setTopP(1.5f))
            .build();
    try {
      client.withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS).infer(invalid);
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() != Status.Code.INVALID_ARGUMENT) {
        throw e;
      }
      // The rich status travels in the grpc-status-details-bin trailer.
      com.google.rpc.Status status = StatusProto.fromThrowable(e);
      if (status == null) {
        throw new IllegalStateException("INVALID_ARGUMENT without status details", e);
      }
      int violations = 0;
      for (Any detail : status.getDetailsList()) {
        if (!detail.is(BadRequest.class)) {
          continue;
        }
        for (BadRequest.FieldViolation violation :
            detail.unpack(BadRequest.class).getFieldViolationsList()) {
          violations++;
          System.out.println(
              "ERROR code="
                  + e.getStatus().getCode().name()
                  + " field="
                  + violation.getField()
                  + " description="
                  + violation.getDescription());
        }
      }
      if (violations == 0) {
        throw new IllegalStateException("INVALID_ARGUMENT without BadRequest details", e);
      }
      return;
    }
    throw new IllegalStateException("the invalid request succeeded");
  }

  /**
   * Sends a system and a user message, which the model's chat template renders into its prompt,
   * and prints each generated token's log-probability followed by its most likely alternatives.
   */
  static void chatWithLogprobs(
      InferenceServiceGrpc.InferenceServiceBlockingStub client, String model) {
    InferResponse response =
        client
            .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
            .infer(
                InferRequest.newBuilder()
                    .setModel(model)
                    .addMessages(ChatMessage.newBuilder().setRole("system").setContent(CHAT_SYSTEM))
                    .addMessages(ChatMessage.newBuilder().setRole("user").setContent(CHAT_USER))
                    .setParameters(
                        GenerationParameters.newBuilder()
                            .setMaxTokens(8)
                            .setTemperature(0f)
                            .setLogprobs(true)
                            .setTopLogprobs(TOP_LOGPROBS))
                    .build());
    System.out.println("CHAT " + quote(response.getText()));
    System.out.println(
        "LOGPROBS tokens=" + response.getLogprobsCount() + " top=" + TOP_LOGPROBS);
    for (TokenLogprob token : response.getLogprobsList()) {
      System.out.println(
          logprobLine("LOGPROB", token.getTokenId(), token.getLogprob(), token.getToken()));
      for (TopLogprob alternative : token.getTopList()) {
        System.out.println(
            logprobLine(
                "TOP", alternative.getTokenId(), alternative.getLogprob(), alternative.getToken()));
      }
    }
  }

  /** One line of the log-probability listing; token ids are proto uint32. */
  static String logprobLine(String kind, int tokenId, float logprob, String token) {
    // Locale.ROOT: a decimal point whatever the JVM's default locale.
    return String.format(
        Locale.ROOT,
        "%s %d %.4f %s",
        kind,
        Integer.toUnsignedLong(tokenId),
        logprob,
        quote(token));
  }

  /** A JSON string literal in plain ASCII, so output never depends on the console's charset. */
  static String quote(String text) {
    StringBuilder out = new StringBuilder(text.length() + 2).append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }
}
