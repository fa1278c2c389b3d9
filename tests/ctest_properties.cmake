# CTest properties of the tests, in one table (included by CMakeLists.txt).
#
# Every test gets the label of its folder (unit, scenario, tools, python) and OMP_NUM_THREADS=1.
# A row below adds, for one test:
#   processes  the most processes it runs at once (its ranks, or the launcher's workers; the
#              test process itself waits meanwhile): CTest's PROCESSORS, so `ctest -j N` never
#              starts more than N busy processes, and a test wider than N runs alone;
#   timeout    seconds: 10x its time in one `ctest -j2` run of the whole suite on the 2-core
#              development VM (the "measured" column; 225 s for all), at least 60 (a shared or
#              slower machine can be several times slower; a hung test still ends in minutes);
#   labels     "slow" for the tests over 10 s there (`ctest -LE slow` leaves them out);
#              "cpu_class" for those whose numerics or cost depend on the CPU class, which
#              .ci/run runs again as an AVX2-only CPU (docs/development.md, "CPU classes").
# Timeouts are sized for the slowest CPU class: a test's time as avx2 (scripts/as_cpu_class.sh)
# counts where it is longer.
# A test without a row: 1 process, MIXTRAIN_TEST_DEFAULT_TIMEOUT seconds, no extra label (every
# such test took under 5 s there); a cuda test without a row (none has run on a GPU yet):
# MIXTRAIN_CUDA_TEST_DEFAULT_TIMEOUT. A row naming no test is a configure error.
set(MIXTRAIN_TEST_DEFAULT_TIMEOUT 60)
set(MIXTRAIN_CUDA_TEST_DEFAULT_TIMEOUT 180)  # a test labelled cuda without a row: unmeasured
set(MIXTRAIN_TEST_TABLE
  # test                                     processes  timeout  labels    measured (s)
  "unit_distributed_config_agreement_test    3          60"      #          2.5
  "unit_distributed_context_parallel_test   4          160      slow"    # 12-16 (load 7; 2 + 4 + 2 + 4 + 2 x 2 ranks)
  "unit_distributed_device_mesh_test         4          60"      #          4.8
  "unit_distributed_distributed_muon_test    4          210      slow"    # 21 (busy machine; tp cases, NorMuon combo)
  "unit_distributed_placed_found_inf_test    4          60"      #          2.8
  "unit_distributed_placed_grad_clip_test    4          60"      #          2.2
  "unit_distributed_expert_parallel_test     4          240      slow"    # 22.2
  "unit_distributed_fsdp_test                4          300      slow"    # 28.4
  "unit_distributed_gloo_collectives_test    4          120"     #          9.4
  "unit_distributed_launcher_test            3          150      slow"    # 13.1
  "unit_distributed_tensor_parallel_test     4          150      slow cpu_class"    # 9.4 alone (22 beside a build; 12.6 as avx2)
  "unit_optim_adamw_test                     1          60"      #          5.3 (child per CPU capability)
  "unit_optim_muon_kernel_test               1          60"      #          6.6 (child per CPU capability)
  "scenarios_checkpoint_resharding_test      4          180      slow"    # 14.3 + 2.8 (NorMuon case; 11.5 on a busy machine)
  "scenarios_rfc_case_2_2_test               2          60"      #          4.6
  "scenarios_rfc_case_2_1_scale_test         8          420      slow"    # 41.6 (2026-12-03; 8 ranks)
  "scenarios_rfc_system_test                 8          360      slow"    # 36.1 (2026-12-03; two 8-rank runs)
  "scenarios_rfc_case_2_4_test              2          600      slow"    # 72 (on a busy machine)
  "unit_model_hf_config_test                1          60"      #          4.5
  "unit_trainer_checkpointing_test           4          60"      #          2.5 (4 ranks: tp boxes)
  "tools_checkpoint_resume_test              1          170      slow cpu_class"    # 13.6 (2026-12-03; 1 process); 16.4 as avx2
  "tools_checkpoint_resume_distributed_test  2          60"     #          4.0 (2026-12-03; 2 ranks)
  "tools_child_process_guard_test            2          60"      #          1.2
  "tools_checkpoint_save_failure_test        2          200      slow"    # 19 (on a busy machine)
  "tools_ckpt_command_test                   1          150      slow"    # 13.1
  "tools_data_prepare_test                   1          130"      #          9.0 (loaded machine; 12 runs of the binary); 12.7 as avx2
  "tools_cli_test                            1          140      slow"    # 11.4 (on a busy machine); 13.8 as avx2
  "tools_distributed_train_test              4          700      slow"    # 69 (2026-12-08; runs of 1, 2 and 4 ranks, QK-clip, HSDP biases, muon_per_head tp)
  "tools_export_hf_command_test              2          320      slow"    # 17.5 (2026-12-03; 8 trainings, 16 transformers runs); 31.4 as avx2 on a loaded machine
  "tools_eval_command_test                   4          250      slow"    # 25.5 (2026-12-03; 1, 2 and 4 ranks, transformers reference)
  "tools_qwen2_train_test                    2          100"     #          9.2 (2026-12-03; 2 ranks)
  "unit_optim_newton_schulz_test             1          60       cpu_class"    # 5.8 (2026-12-03); 1.3 as avx2
  "unit_data_bpe_tokenizer_test              1          60"      #          1.8 (2026-12-03; the Python tokenizers reference)
  "tools_optim_replay_command_test           1          120"     #          9.3
  "tools_optim_replay_distributed_test       4          120      slow"    # 10.6
  "tools_optimizer_report_test               2          120"     #          9.6 (on a busy machine)
  "tools_swap_optimizer_test                 1          140      slow"    # 13.5 (2026-12-03; 1 rank)
  "tools_swap_optimizer_distributed_test     2          130      slow"    # 12.6 (2026-12-03; 2 ranks)
  "tools_train_command_test                  1          230      slow"    # 22.6 (2026-12-03; 1 process)
  "tools_train_command_distributed_test      2          60"     #          4.3 (2026-12-03; 2 ranks)
  "tools_readme_walkthrough_test             2          160      slow"    # 13.8; 16.0 as avx2
  "tools_tied_embeddings_train_test          2          220      slow"    # 12.6-21.9 (2026-12-08; 1-2 ranks, 10 runs, 5 recorded Trainers)
  "tools_activation_checkpointing_train_test 2          230      slow"    # 22.8 (2026-12-08; 1-2 ranks, 12 runs, counting ops)
  "tools_real_size_config_test               2          320      slow cpu_class"    # ~25 (2026-12-04; 2 ranks, 151,936 vocabulary, ~4.4 GB each); 31.8 as avx2 (it timed out at 300 on an AVX2-only CPU before its bf16 GEMMs were widened)
  "unit_model_mistral_test                   1          80"      #          7.8 (2026-12-04; transformers reference)
  "unit_core_cpu_gemm_test                   1          60       cpu_class"    # 0.4 (2026-12-08); 1.0 as avx2
  "tools_op_budget_test                      1          250      slow cpu_class"    # 21 alone (2026-12-08; 3 counted runs + 2 forced-path ones); 18 as avx2
  "unit_model_routed_experts_test            1          60       cpu_class"    # 2.7 (2026-12-08); 0.6 as avx2 (the padding tests skip)
  "unit_model_attention_test                 1          60       cpu_class"    # 1.2 as avx2
  "unit_model_layers_test                    1          60       cpu_class"    # 0.5 as avx2
  "python_adamw_oracle                       1          300      slow"    # 31 (alone)
  "python_muon_oracle                        1          210      slow"    # 11-21 (alone)
  "python_sgd_oracle                         1          180      slow"    # 17.5 (loaded machine)
  "python_safetensors_oracle                 2          70       "        # 7 (alone; 2 ranks)
  "python_twin_oracle                        1          70       "        # 5-7 (loaded machine)
  "python_package_checkpoint_test            1          90       "        # 6-9 (2026-12-04; 4 trainings of the tiny config)
  "python_package_optim_test                 1          100      "        # 9.2 (2026-12-04; a child per CPU capability)
  "python_example_hf_finetune_muon           1          60       "        # 5.5 (2026-12-04; transformers import)
)

# Applies the table to the tests already added; call once, after the last add_test.
function(mixtrain_apply_test_properties tests)
  set(listed)
  foreach(row ${MIXTRAIN_TEST_TABLE})
    separate_arguments(fields UNIX_COMMAND "${row}")
    list(GET fields 0 name)
    list(GET fields 1 processes)
    list(GET fields 2 timeout)
    set(labels)
    list(LENGTH fields count)
    if(count GREATER 3)
      list(SUBLIST fields 3 -1 labels)
    endif()
    if(NOT name IN_LIST tests)
      message(FATAL_ERROR "tests/ctest_properties.cmake: no test named '${name}'")
    endif()
    list(APPEND listed ${name})
    get_test_property(${name} LABELS folder_label)
    set_tests_properties(${name} PROPERTIES
      PROCESSORS ${processes} TIMEOUT ${timeout} LABELS "${folder_label};${labels}")
  endforeach()
  foreach(name ${tests})
    if(NOT name IN_LIST listed)
      get_test_property(${name} LABELS test_labels)
      if("cuda" IN_LIST test_labels)
        # Never measured on a GPU: the first device run (its build, cuBLAS/NCCL start-up) has
        # no figure to scale, so a generous bound until one is written here.
        set_tests_properties(${name} PROPERTIES TIMEOUT ${MIXTRAIN_CUDA_TEST_DEFAULT_TIMEOUT})
      else()
        set_tests_properties(${name} PROPERTIES TIMEOUT ${MIXTRAIN_TEST_DEFAULT_TIMEOUT})
      endif()
    endif()
  endforeach()
endfunction()
