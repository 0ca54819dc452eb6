//! gRPC server reflection on the gRPC port, through a real socket, as a
//! `grpcurl`-style tool uses it: list the services, fetch the file that
//! declares a method, follow its imports until every file is in hand, and
//! then call the native API and Envoy's RLS with messages built only from
//! those descriptors (prost-reflect's dynamic messages).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};

use common::TestServer;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::{rls, v1};
use tonic::transport::Channel;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
use tonic_reflection::pb::v1alpha;

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: path
    rate_limit: { unit: day, requests_per_unit: 1 }
---
namespaces:
  - name: app
    resources:
      - { name: api, algorithm: gcra, rate: 10/s, burst: 5 }
"#;

async fn channel(s: &TestServer) -> Channel {
    let endpoint = Channel::from_shared(s.grpc_url()).unwrap();
    endpoint.connect().await.unwrap()
}

/// One `ServerReflectionInfo` stream, asked one question at a time.
struct Reflection {
    ask: mpsc::Sender<ServerReflectionRequest>,
    answers: tonic::Streaming<ServerReflectionResponse>,
}

impl Reflection {
    async fn open(s: &TestServer) -> Reflection {
        let mut client = ServerReflectionClient::new(channel(s).await);
        let (ask, questions) = mpsc::channel(1);
        let answers = client
            .server_reflection_info(ReceiverStream::new(questions))
            .await
            .unwrap()
            .into_inner();
        Reflection { ask, answers }
    }

    async fn ask(&mut self, request: MessageRequest) -> MessageResponse {
        self.try_ask(request).await.unwrap()
    }

    /// An answer, or the status that ended the stream.
    async fn try_ask(&mut self, request: MessageRequest) -> Result<MessageResponse, tonic::Status> {
        self.ask
            .send(ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            })
            .await
            .unwrap();
        let answer = self.answers.message().await?.unwrap();
        Ok(answer.message_response.unwrap())
    }

    async fn services(&mut self) -> BTreeSet<String> {
        match self.ask(MessageRequest::ListServices(String::new())).await {
            MessageResponse::ListServicesResponse(list) => {
                list.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("{other:?}"),
        }
    }

    /// The files of one answer, decoded.
    async fn files(&mut self, request: MessageRequest) -> Vec<FileDescriptorProto> {
        match self.ask(request).await {
            MessageResponse::FileDescriptorResponse(files) => files
                .file_descriptor_proto
                .iter()
                .map(|f| FileDescriptorProto::decode(f.as_slice()).unwrap())
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    /// The file declaring `symbol` and every file it imports, fetched by
    /// name as a reflection client does.
    async fn closure(&mut self, symbol: &str) -> FileDescriptorSet {
        let mut have: HashMap<String, FileDescriptorProto> = HashMap::new();
        let mut due = self
            .files(MessageRequest::FileContainingSymbol(symbol.to_owned()))
            .await;
        while let Some(file) = due.pop() {
            for import in &file.dependency {
                if !have.contains_key(import) && !due.iter().any(|f| f.name() == import) {
                    due.extend(
                        self.files(MessageRequest::FileByFilename(import.clone()))
                            .await,
                    );
                }
            }
            have.insert(file.name().to_owned(), file);
        }
        FileDescriptorSet {
            file: have.into_values().collect(),
        }
    }
}

#[tokio::test]
async fn reflection_lists_the_native_api_the_rls_health_and_itself() {
    let s = TestServer::start(CONFIG).await;
    let listed = Reflection::open(&s).await.services().await;
    for service in [
        "tollgate.v1.Tollgate",
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(listed.contains(service), "{service} not in {listed:?}");
    }
    // Only what the port serves: Envoy's imports declare no services.
    assert_eq!(listed.len(), 4, "{listed:?}");

    // v1alpha, for older tools, lists the same APIs.
    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&s).await);
    let question = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([question]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("{answer:?}");
    };
    let names: BTreeSet<_> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "tollgate.v1.Tollgate",
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(service), "{service} not in {names:?}");
    }
}

#[tokio::test]
async fn a_method_resolves_to_its_file_with_comments_and_unknown_symbols_are_not_found() {
    let s = TestServer::start(CONFIG).await;
    let mut r = Reflection::open(&s).await;
    let files = r
        .files(MessageRequest::FileContainingSymbol(
            "tollgate.v1.Tollgate.Request".to_owned(),
        ))
        .await;
    assert_eq!(files.len(), 1);
    let file = &files[0];
    assert_eq!(file.name(), "tollgate/v1/tollgate.proto");
    let service = &file.service[0];
    assert_eq!(service.name(), "Tollgate");
    let methods: Vec<_> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        ["Request", "Session", "Status", "Inspect", "Reset"]
    );
    // The native API's comments come along, for `grpcurl describe`.
    assert!(file.source_code_info.is_some());

    let files = r
        .files(MessageRequest::FileContainingSymbol(
            "grpc.health.v1.Health.Check".to_owned(),
        ))
        .await;
    assert_eq!(files[0].package(), "grpc.health.v1");

    // tonic-reflection ends the stream with the status rather than
    // answering with an error message; either way the client is told.
    let e = r
        .try_ask(MessageRequest::FileContainingSymbol(
            "tollgate.v1.Nope".to_owned(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}

/// Calls `method` of `service` with `request` (encoded from descriptors
/// alone), decoding the answer as `R`.
async fn call<R: Message + Default + Send + 'static>(
    s: &TestServer,
    service: &str,
    method: &str,
    request: DynamicMessage,
) -> R {
    let mut grpc = tonic::client::Grpc::new(channel(s).await);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::try_from(format!("/{service}/{method}")).unwrap();
    let codec = tonic_prost::ProstCodec::<DynamicMessage, R>::default();
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn both_apis_can_be_called_with_nothing_but_the_reflected_descriptors() {
    let s = TestServer::start(CONFIG).await;
    let mut r = Reflection::open(&s).await;

    // The native API.
    let pool =
        DescriptorPool::from_file_descriptor_set(r.closure("tollgate.v1.Tollgate").await).unwrap();
    let service = pool.get_service_by_name("tollgate.v1.Tollgate").unwrap();
    let method = service.methods().find(|m| m.name() == "Request").unwrap();
    let mut request = DynamicMessage::new(method.input());
    request.set_field_by_name("namespace", Value::String("app".into()));
    request.set_field_by_name("resource", Value::String("api".into()));
    request.set_field_by_name("domain", Value::String("d".into()));
    request.set_field_by_name("hits", Value::U64(2));
    let answer: v1::RateResponse = call(&s, service.full_name(), method.name(), request).await;
    assert!(answer.allowed, "{answer:?}");
    assert_eq!(answer.granted, 2, "{answer:?}");

    // Envoy's RLS: its file imports the descriptor, header and unit
    // files and Google's well-known types, all of which must come.
    let set = r
        .closure("envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit")
        .await;
    let mut names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "envoy/config/core/v3/base.proto",
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/type/v3/ratelimit_unit.proto",
            "google/protobuf/duration.proto",
            "google/protobuf/struct.proto",
            "google/protobuf/timestamp.proto",
            "google/protobuf/wrappers.proto",
        ]
    );
    let pool = DescriptorPool::from_file_descriptor_set(set).unwrap();
    let service = pool
        .get_service_by_name("envoy.service.ratelimit.v3.RateLimitService")
        .unwrap();
    let method = service
        .methods()
        .find(|m| m.name() == "ShouldRateLimit")
        .unwrap();
    let entry_type = pool
        .get_message_by_name("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry")
        .unwrap();
    let mut entry = DynamicMessage::new(entry_type);
    entry.set_field_by_name("key", Value::String("path".into()));
    entry.set_field_by_name("value", Value::String("/a".into()));
    let descriptor_type = pool
        .get_message_by_name("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor")
        .unwrap();
    let mut descriptor = DynamicMessage::new(descriptor_type);
    descriptor.set_field_by_name("entries", Value::List(vec![Value::Message(entry)]));
    let mut request = DynamicMessage::new(method.input());
    request.set_field_by_name("domain", Value::String("shop".into()));
    request.set_field_by_name("descriptors", Value::List(vec![Value::Message(descriptor)]));
    let ask = || request.clone();
    let first: rls::RateLimitResponse = call(&s, service.full_name(), method.name(), ask()).await;
    assert_eq!(first.overall_code(), rls::rate_limit_response::Code::Ok);
    let second: rls::RateLimitResponse = call(&s, service.full_name(), method.name(), ask()).await;
    assert_eq!(
        second.overall_code(),
        rls::rate_limit_response::Code::OverLimit
    );
}
