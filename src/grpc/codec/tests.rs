//! gRPC messages to the shared infer request and back: raw and typed contents, the
//! checks on shapes, ranges and reserved parameters, and the final flag.

use std::collections::HashMap;

use super::*;
use crate::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};

fn tensor(
    name: &str,
    dt: &str,
    shape: &[i64],
    contents: Option<proto::InferTensorContents>,
) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: dt.into(),
        shape: shape.to_vec(),
        parameters: HashMap::new(),
        contents,
    }
}

/// What tritonclient.grpc sends by default: every input's data raw.
fn raw_request() -> ModelInferRequest {
    let mut text = 2u32.to_le_bytes().to_vec();
    text.extend_from_slice(b"Hi");
    ModelInferRequest {
        model_name: "ensemble".into(),
        id: "r1".into(),
        inputs: vec![
            tensor("text_input", "BYTES", &[1, 1], None),
            tensor("max_tokens", "INT32", &[1, 1], None),
        ],
        raw_input_contents: vec![text, 8i32.to_le_bytes().to_vec()],
        ..Default::default()
    }
}

#[test]
fn raw_inputs_decode_as_the_http_binary_ones_do() {
    let mut r = raw_request();
    r.parameters.insert(EMPTY_FINAL.into(), bool_param(true));
    r.outputs.push(InferRequestedOutputTensor {
        name: "text_output".into(),
        parameters: HashMap::new(),
    });
    let req = infer_request(r).unwrap();
    assert_eq!(req.id.as_deref(), Some("r1"));
    assert_eq!(req.inputs[0].data, Data::Bytes(vec![b"Hi".to_vec()]));
    assert_eq!(req.inputs[1].data, Data::Int(vec![8]));
    assert_eq!(req.inputs[1].shape, vec![1, 1]);
    assert_eq!(req.outputs.unwrap()[0].name, "text_output");
    assert!(
        req.parameters.is_empty(),
        "the empty-final flag is the transport's"
    );
}

#[test]
fn typed_contents_decode() {
    let r = ModelInferRequest {
        model_name: "tensorrt_llm".into(),
        inputs: vec![
            tensor(
                "input_ids",
                "INT32",
                &[1, 3],
                Some(proto::InferTensorContents {
                    int_contents: vec![5, 6, 7],
                    ..Default::default()
                }),
            ),
            tensor(
                "streaming",
                "BOOL",
                &[1, 1],
                Some(proto::InferTensorContents {
                    bool_contents: vec![true],
                    ..Default::default()
                }),
            ),
            tensor(
                "temperature",
                "FP32",
                &[1, 1],
                Some(proto::InferTensorContents {
                    fp32_contents: vec![0.5],
                    ..Default::default()
                }),
            ),
        ],
        ..Default::default()
    };
    let req = infer_request(r).unwrap();
    assert_eq!(req.inputs[0].data, Data::Int(vec![5, 6, 7]));
    assert_eq!(req.inputs[1].data, Data::Bool(vec![true]));
    assert_eq!(req.inputs[2].data, Data::Float(vec![0.5]));
}

#[test]
fn malformed_requests_are_refused_with_what_is_wrong() {
    type Edit = Box<dyn Fn(&mut ModelInferRequest)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|r| r.raw_input_contents.pop().map(drop).unwrap_or(())),
            "raw_input_contents holds 1 entries for 2 inputs",
        ),
        (
            Box::new(|r| r.inputs[1].datatype = "INT33".into()),
            "unknown datatype 'INT33'",
        ),
        (
            Box::new(|r| r.inputs[1].shape = vec![1, 2]),
            "binary_data_size is 4 bytes but 2 INT32 elements take 8",
        ),
        (
            Box::new(|r| r.inputs[1].shape = vec![-1, 1]),
            "negative dimension -1",
        ),
        (
            Box::new(|r| {
                r.parameters.insert("triton_x".into(), bool_param(true));
            }),
            "'triton_x'",
        ),
        (
            Box::new(|r| r.raw_input_contents[0] = vec![9, 0, 0, 0, b'H']),
            "claims 9 bytes",
        ),
    ];
    for (edit, want) in cases {
        let mut r = raw_request();
        edit(&mut r);
        let e = infer_request(r).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} should say {want:?}");
    }
    // Typed contents: counts must match the shape, narrow integers their range.
    let typed_req = |dt: &str, c: proto::InferTensorContents| ModelInferRequest {
        inputs: vec![tensor("x", dt, &[1, 2], Some(c))],
        ..Default::default()
    };
    let e = infer_request(typed_req(
        "INT32",
        proto::InferTensorContents {
            int_contents: vec![1],
            ..Default::default()
        },
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("holds 2 elements but 1 were given"), "{e}");
    let e = infer_request(typed_req(
        "INT8",
        proto::InferTensorContents {
            int_contents: vec![1, 300],
            ..Default::default()
        },
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("300 is out of range for INT8"), "{e}");
    let e = infer_request(typed_req("FP16", Default::default()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("raw_input_contents"), "{e}");
}

#[test]
fn outputs_travel_raw_with_the_final_flag() {
    let outputs = vec![
        Output {
            name: "output_ids".into(),
            datatype: DataType::I32,
            shape: vec![1, 1, 2],
            data: Data::Int(vec![7, -1]),
            binary: false,
        },
        Output {
            name: "text_output".into(),
            datatype: DataType::Bytes,
            shape: vec![1, 1],
            data: Data::Bytes(vec![b"ok".to_vec()]),
            binary: false,
        },
    ];
    let r = infer_response("tensorrt_llm", Some("a"), outputs, Some(true));
    assert_eq!(r.id, "a");
    assert_eq!(r.outputs[0].shape, vec![1, 1, 2]);
    assert_eq!(r.outputs[0].datatype, "INT32");
    assert_eq!(
        r.raw_output_contents[0],
        [7i32.to_le_bytes(), (-1i32).to_le_bytes()].concat()
    );
    assert_eq!(
        r.raw_output_contents[1],
        [&2u32.to_le_bytes()[..], b"ok"].concat()
    );
    assert_eq!(r.parameters[FINAL], bool_param(true));
    assert!(infer_response("m", None, Vec::new(), None)
        .parameters
        .is_empty());
}

#[test]
fn config_json_maps_to_its_message() {
    let v = serde_json::json!({
        "name": "ensemble", "platform": "ensemble", "backend": "", "max_batch_size": 64,
        "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1], "optional": false}],
        "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
        "model_transaction_policy": {"decoupled": true},
        "ensemble_scheduling": {"step": [{"model_name": "tensorrt_llm", "model_version": -1,
            "input_map": {"request_output_len": "max_tokens"}, "output_map": {}}]},
    });
    let c = config(&v);
    assert_eq!(c.max_batch_size, 64);
    assert_eq!(c.input[0].data_type, proto::DataType::TypeString as i32);
    assert_eq!(c.output[0].dims, vec![-1]);
    assert!(c.model_transaction_policy.unwrap().decoupled);
    match c.scheduling_choice {
        Some(proto::model_config::SchedulingChoice::EnsembleScheduling(e)) => {
            assert_eq!(e.step[0].model_name, "tensorrt_llm");
            assert_eq!(e.step[0].input_map["request_output_len"], "max_tokens");
        }
        other => panic!("{other:?}"),
    }
}
